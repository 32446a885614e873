"""mkdocs hook: show mkdocstrings the package as it installs.

setup.py maps the top-level folders `ledger/ replay/ trainers/ engine/ migrations/` to
`seedledger.<folder>`, which static analysis cannot follow. This links them under
`build/package-view/seedledger/` (beside seedledger/'s own files) at start-up: mkdocstrings
resolves its `paths` in its own on_config, before a hook's on_config would run."""

from pathlib import Path

LAYERS = ("ledger", "replay", "trainers", "engine", "migrations")


def on_startup(**_):
    root = Path(__file__).resolve().parents[2]
    view = root / "build" / "package-view" / "seedledger"
    view.mkdir(parents=True, exist_ok=True)
    targets = {entry.name: entry for entry in (root / "seedledger").iterdir() if entry.suffix == ".py"}
    targets |= {layer: root / layer for layer in LAYERS}
    for name, target in targets.items():
        link = view / name
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(target.resolve())
