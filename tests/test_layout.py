"""Quality gates: every module imports, and imports point one way (docs/design.md).

Everything imports as `seedledger.<layer>` (the folders `ledger/ replay/ trainers/ engine/
migrations/` are mapped by setup.py). `engine → trainers → replay → ledger` (skipping a step
is fine, going back up is not); `migrations` belongs to `ledger`; nothing imports `engine` but
the `seedledger` package, which re-exports the public API (seedledger.engine.api).
"""

import ast
import importlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["ledger", "migrations", "replay", "trainers", "engine"]
PACKAGES = [*LAYERS, "seedledger"]
ALLOWED = {
    "ledger": {"ledger", "migrations"},
    "migrations": {"migrations", "ledger"},
    "replay": {"replay", "ledger"},
    "trainers": {"trainers", "replay", "ledger"},
    "engine": {"engine", "trainers", "replay", "ledger", "migrations"},
    "seedledger": {"seedledger", "engine", "ledger"},  # the public API: engine.api, re-exported
}


def modules() -> list[tuple[str, Path]]:
    """(dotted name as imported, path) of every module: `seedledger.<layer>.…`."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if package != "seedledger":
                parts = ("seedledger", *parts)
            found.append((".".join(parts), path))
    return found


def layer(name: str) -> str:
    """The layer a dotted name belongs to: `seedledger.replay.noise` → `replay`; the API
    package itself → `seedledger`; a bare `engine…` (the old, colliding name) → `bare engine`."""
    parts = name.split(".")
    if parts[0] == "seedledger":
        return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "seedledger"
    return f"bare {parts[0]}" if parts[0] in LAYERS else ""


def imported_packages(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {layer(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: stays inside its own package
                names.add(layer(module))
            elif node.module:
                names.add(layer(node.module))
    return names - {""}


def test_imports_point_one_way():
    wrong = {module: sorted(imported_packages(path, module) - ALLOWED[layer(module)]) for module, path in modules()}
    wrong = {module: layers for module, layers in wrong.items() if layers}
    assert not wrong, f"against engine → trainers → replay → ledger, modules import: {wrong}"


def test_every_module_imports():
    failed = {}
    for module, _ in modules():
        if module.startswith("seedledger.migrations.") or module == "seedledger.__main__":
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001  (each failure named below)
            failed[module] = f"{type(exc).__name__}: {exc}"
    assert not failed, failed


MAX_LINES = 400  # a file is one idea; split by purpose past this, never fold lines to fit


def test_files_stay_under_the_line_limit():
    """Every Python file of the repository (product, tests, benchmarks, docs hooks)."""
    listed = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.py"]
    names = subprocess.run(listed, cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    long = {name: n for name in filter(None, names) if (ROOT / name).is_file()
            and (n := len((ROOT / name).read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


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


# engine/ by purpose: each part imports only the parts listed (its own modules always).
# cli (the commands) sits on top; api is the Python surface; search (tune, PBT) and rebuild
# use the runtime; the runtime (session, loop and their rooms: RUNTIME_ROOMS) uses only the
# run's configuration and refs.
ENGINE_PARTS = {
    "cli": {"api", "evolve", "search", "rebuild", "runtime", "config", "refs"},  # runtime: its package only
    "evolve": {"api", "runtime", "config", "refs"},  # seedledger.evolve: any torch.nn.Module
    "api": {"rebuild", "runtime", "config", "refs"},
    "search": {"runtime", "config", "refs"},
    "rebuild": {"runtime", "config", "refs"},
    "runtime": {"config", "refs"},
    "config": set(),
    "refs": set(),
}
# one part: the run's configuration
CONFIG = {"config", "config_backends", "config_errors", "config_kinds", "config_paths", "config_sections"}


def engine_part(name: str) -> str | None:
    """`seedledger.engine.runtime.loop` → `runtime`; `seedledger.engine.config_errors` →
    `config`; None outside engine/ or for the package itself."""
    parts = name.split(".")
    if parts[:2] != ["seedledger", "engine"] or len(parts) < 3:
        return None
    return "config" if parts[2] in CONFIG else parts[2]


def imports_downwards(part_of, allowed: dict[str, set[str]], where: str) -> None:
    """Every module in a part (`part_of(module)`, None outside) imports only its own part and
    the parts `allowed` lists for it; an unknown part fails, so a new one is declared."""
    for module, imported in GRAPH.items():
        part = part_of(module)
        if part is None:
            continue
        assert part in allowed, f"{module}: {where}/{part} is not a known part of {where}/"
        wrong = sorted(m for m in imported if part_of(m) not in (None, part, *allowed[part]))
        assert not wrong, f"{module} ({where}/{part}) imports {wrong}"


def test_engine_parts_import_downwards():
    imports_downwards(engine_part, ENGINE_PARTS, "engine")


# engine/runtime/ by room: session.py runs a session down one path and loop.py its generations;
# what they use lives in rooms (folders), each importing only the rooms listed (its own modules
# always), so a change has one place to go. A new module goes into the room of its purpose; a
# new room, or a module beside session and loop, is added here.
RUNTIME_ROOMS = {
    "session": {"loop", "setup", "models", "scoring", "backends", "pools", "console", "loggers", "hooks", "dirs"},
    "loop": {"scoring", "console", "hooks", "failpoints"},
    "pools": {"scoring", "models", "failpoints"},  # local, ray
    "scoring": {"backends", "setup", "models", "hooks", "dirs"},  # evaluator (the replica), heldout, no_signal
    "backends": {"setup", "models"},  # hf, vllm, module; choice (what `auto` takes)
    "setup": {"models", "console", "loggers"},  # plans, guards, preflight, inputs, stored_code, batching
    "models": {"console"},  # resolve, cache, provisioning, provenance, module, adapters
    "console": {"hooks"},  # terminal, progress, interrupts
    "loggers": set(),  # the trackers
    "hooks": set(), "failpoints": set(), "dirs": set(),  # small helpers the rooms share
}


def runtime_room(name: str) -> str | None:
    """`seedledger.engine.runtime.models.cache` → `models`, `….runtime.loop` → `loop`; None
    outside engine/runtime/ or for the package itself."""
    parts = name.split(".")
    return parts[3] if parts[:3] == ["seedledger", "engine", "runtime"] and len(parts) > 3 else None


def test_runtime_rooms_import_downwards():
    imports_downwards(runtime_room, RUNTIME_ROOMS, "engine/runtime")


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """The first import cycle in `graph` (module -> the modules it imports), as the path
    that closes it (`a -> b -> a`), or None."""
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*path, m, n]
            if n not in state and (found := visit(n, [*path, m])):
                return found
        state[m] = 2
        return None

    return next((found for m in sorted(graph) if m not in state and (found := visit(m, []))), None)


def test_cli_enters_the_runtime_by_its_package():
    """engine/cli imports the runtime's package (engine/runtime/__init__.py: its `__all__`,
    the command line's one entry), never a room: no module under engine.runtime, lazy
    imports included; the rest it reaches through engine.api."""
    runtime = importlib.import_module("seedledger.engine.runtime")
    wrong = sorted(f"{m} imports {i}" for m, deps in GRAPH.items() if engine_part(m) == "cli"
                   for i in deps if runtime_room(i))
    for path in sorted((ROOT / "engine" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == runtime.__name__:
                wrong += [f"{path.name}: {a.name}" for a in node.names if a.name not in runtime.__all__]
    assert not wrong, f"engine/cli reaches past seedledger.engine.runtime's exports: {wrong}"


def test_the_runtime_entry_resolves_lazily():
    """Every exported name resolves, and importing the package alone loads no room (what
    the console script starts without: issue 45 item 3)."""
    runtime = importlib.import_module("seedledger.engine.runtime")
    assert all(getattr(runtime, name) is not None for name in runtime.__all__)
    code = "import sys, seedledger.engine.runtime\nprint(sorted(m for m in sys.modules if m.startswith('seedledger.')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert ast.literal_eval(proc.stdout) == ["seedledger.engine", "seedledger.engine.runtime"]


@pytest.mark.parametrize("package", ["ledger", "replay", "trainers", "engine"])
def test_no_import_cycles(package):
    """Modules of a package import one way too (e.g. ledger.lease never imports the ledger
    that imports it): no cycle among them, lazy imports included."""
    prefix = f"seedledger.{package}."
    graph = {m: {i for i in deps if i.startswith(prefix)} for m, deps in GRAPH.items() if m.startswith(prefix)}
    found = cycle(graph)
    assert found is None, "import cycle: " + " -> ".join(found or [])


BENCHMARKS = ROOT / "benchmarks"


def benchmark_imports(path: Path) -> set[str]:
    """The benchmark scripts `path` imports (lazy imports included), by stem: as
    `benchmarks.x`, `from benchmarks import x`, or a bare `x` (a script's folder is on sys.path)."""
    stems = {p.stem for p in BENCHMARKS.glob("*.py")}
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for parts in (name.split(".") for name in names):
            if parts[0] == "benchmarks" and len(parts) > 1:
                out.add(parts[1])
            elif parts[0] in stems:
                out.add(parts[0])
    return (out & stems) - {path.stem}


def test_benchmarks_import_no_circle():
    """Scripts that share helpers import a common module (population_common, choosing_common),
    never each other in a circle (lora_bench -> population_bench -> population_bench_vllm ->
    lora_bench was one)."""
    graph = {p.stem: benchmark_imports(p) for p in sorted(BENCHMARKS.glob("*.py"))}
    assert graph["lora_bench"] >= {"population_common"}  # the scan sees both import spellings
    found = cycle(graph)
    assert found is None, "import circle in benchmarks/: " + " -> ".join(found or [])


def test_the_wheel_installs_one_package(tmp_path):
    """`pip install seedledger` puts `seedledger` alone into site-packages (no top-level
    `engine` or `migrations` to collide with a user's project), with its data files."""
    import shutil

    source = tmp_path / "source"  # setuptools builds in the source's build/: a copy, not the checkout
    listed = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(listed, cwd=ROOT, check=True, capture_output=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("seedledger-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"seedledger", wheel.name.split("-py")[0] + ".dist-info"}
    shipped = {m.replace(".", "/") for m, _ in modules()}
    assert {n.removesuffix(".py").removesuffix("/__init__") for n in names if n.endswith(".py")} == shipped
    for data in ("seedledger/engine/configs/demo.yaml", "seedledger/migrations/script.py.mako",
                 "seedledger/engine/configs/data/words.jsonl",
                 "seedledger/engine/runtime/models/smollm2_tokenizer.json.zst"):
        assert data in names
    assert any(n.startswith("seedledger/replay/") and n.endswith(".bin") for n in names)
