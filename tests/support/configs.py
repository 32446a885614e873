"""Training configs for tests that drive the console script on the `tiny` model."""

from __future__ import annotations

from typing import Any

import yaml

# Two short generations of `tiny` on arithmetic; the length penalty gives the random model
# rewards that differ, so coefficients are non-zero and the weights move.
TINY = {
    "model": "tiny",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 12}]},
    "population": 4,
    "generations": 2,
    "batch_size": 2,
    "max_new_tokens": 4,
    "seed": 7,
}


def tiny_config(**overrides: Any) -> str:
    """`TINY` with `overrides`, as YAML text for a config file."""
    return yaml.safe_dump({**TINY, **overrides}, sort_keys=False)
