"""Packages: everything installs under one name, `seedledger`.

The repository keeps its layers as top-level folders (`ledger/ replay/ trainers/ engine/
migrations/`, docs/design.md); `package_dir` maps each to `seedledger.<folder>`, so site-packages
gains `seedledger` alone and no `engine` or `migrations` that a user's project may also have.
The list is computed so a new subpackage cannot be left out (tests/test_layout.py checks it)."""

from setuptools import find_packages, setup

LAYERS = ("ledger", "replay", "trainers", "engine", "migrations")

setup(
    packages=["seedledger"] + [f"seedledger.{name}" for name in find_packages(include=[f"{layer}*" for layer in LAYERS])],
    package_dir={"seedledger": "seedledger", **{f"seedledger.{layer}": layer for layer in LAYERS}},
)
