"""Config -> flat scalar params, the only shape every tracker's params/hparams accept."""

from __future__ import annotations

import json
from typing import Any

Scalar = int | float | str | bool


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """Nested keys become dotted (`optimizer.beta`), as `--set` spells them; lists and
    other values become JSON text so nothing is silently dropped."""
    out: dict[str, Scalar] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
        else:
            out[name] = json.dumps(value, sort_keys=True, default=str)
    return out
