"""Quality gates: every module imports, and imports point one way (DESIGN.md).

`engine → trainers → replay → ledger` (skipping a step is fine, going back up is not);
`migrations` belongs to `ledger`; nothing imports `engine` but the `seedledger` package,
which re-exports the public API (engine.api).
"""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["ledger", "migrations", "replay", "trainers", "engine", "seedledger"]
ALLOWED = {
    "ledger": {"ledger", "migrations"},
    "migrations": {"migrations", "ledger"},
    "replay": {"replay", "ledger"},
    "trainers": {"trainers", "replay", "ledger"},
    "engine": {"engine", "trainers", "replay", "ledger", "migrations"},
    "seedledger": {"seedledger", "engine", "ledger"},  # the public API: engine.api, re-exported
}


def modules() -> list[tuple[str, Path]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.append((".".join(parts), path))
    return found


def imported_packages(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: stays inside its own package
                names.add(module.split(".")[0])
            elif node.module:
                names.add(node.module.split(".")[0])
    return names & set(PACKAGES)


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_imports_point_one_way(module, path):
    package = module.split(".")[0]
    wrong = imported_packages(path, module) - ALLOWED[package]
    assert not wrong, f"{module} imports {sorted(wrong)}, against engine → trainers → replay → ledger"


@pytest.mark.parametrize("module", [m for m, _ in modules() if not m.startswith("migrations.")])
def test_every_module_imports(module):
    importlib.import_module(module)


def imported_modules(path: Path, module: str) -> set[str]:
    """The project's modules that `module` imports (anywhere in it), by full dotted name;
    `from pkg import name` counts as importing pkg.name when that is a module."""
    known = {m for m, _ in modules()}
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = f"{parent}.{base}" if base else parent
            out.add(base)
            out |= {f"{base}.{alias.name}" for alias in node.names}
    return out & known


# a module's own packages are not edges: they are initialized before it, whatever it imports
GRAPH = {m: {i for i in imported_modules(p, m) if not (m + ".").startswith(i + ".")} for m, p in modules()}


def test_nothing_outside_the_commands_imports_them():
    """engine/commands (the CLI and the work only commands do) sits on top of the runtime
    of engine/; only engine.cli, the console script's entry point, imports it."""
    for module, imported in GRAPH.items():
        if module.startswith("engine.commands") or module == "engine.cli":
            continue
        wrong = sorted(m for m in imported if m == "engine.commands" or m.startswith("engine.commands."))
        assert not wrong, f"{module} imports {wrong}"


@pytest.mark.parametrize("package", ["ledger", "replay", "trainers"])
def test_no_import_cycles(package):
    """Modules of a package import one way too (e.g. ledger.lease never imports the ledger
    that imports it): no cycle among them, lazy imports included."""
    graph = {m: {i for i in deps if i.startswith(package + ".")} for m, deps in GRAPH.items()
             if m.startswith(package + ".")}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            assert state.get(n) != 1, "import cycle: " + " -> ".join([*path, m, n])
            if n not in state:
                visit(n, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
