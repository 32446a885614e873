"""Packages: everything installs under one name, `seedledger`.

The repository keeps its layers as top-level folders (`ledger/ replay/ trainers/ engine/
migrations/`, docs/design.md); `package_dir` maps each to `seedledger.<folder>`, so site-packages
gains `seedledger` alone and no `engine` or `migrations` that a user's project may also have.
The list is computed so a new subpackage cannot be left out (tests/test_layout.py checks it)."""

from setuptools import find_packages, setup

LAYERS = ("ledger", "replay", "trainers", "engine", "migrations")
# folders of package data (no __init__.py): packages too, or setuptools warns that each "would
# be ignored" (a 40-line BuildBackendWarning apiece on every install)
DATA = ("engine.configs", "engine.configs.data", "migrations.versions")

setup(
    packages=["seedledger"]
    + [f"seedledger.{name}" for name in find_packages(include=[f"{layer}*" for layer in LAYERS])]
    + [f"seedledger.{name}" for name in DATA],
    package_dir={"seedledger": "seedledger", **{f"seedledger.{layer}": layer for layer in LAYERS}},
)
