"""Quality gates: every module imports, and imports point one way (DESIGN.md).

`engine → trainers → replay → ledger` (skipping a step is fine, going back up is not);
`migrations` belongs to `ledger`; nothing imports `engine`.
"""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["ledger", "migrations", "replay", "trainers", "engine"]
ALLOWED = {
    "ledger": {"ledger", "migrations"},
    "migrations": {"migrations", "ledger"},
    "replay": {"replay", "ledger"},
    "trainers": {"trainers", "replay", "ledger"},
    "engine": {"engine", "trainers", "replay", "ledger", "migrations"},
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
