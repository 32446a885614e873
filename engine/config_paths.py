"""A config's relative file references made absolute, so the config stored with a run
loads the same files from wherever it is resumed: dataset and reward-file paths in `task`,
a module run's `model: module:file.py:factory` and `train.init` (a PEFT adapter directory).
`engine.config` resolves a config file's own against the file's directory, and `--set`
values against the working directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seedledger.engine.config_kinds import KEY, one_key
from seedledger.trainers.rewards.loader import is_file_ref
from seedledger.trainers.tasks.registry import absolute_paths


def absolute_refs(data: Any, base_dir: str | Path) -> Any:
    """`data` (a config mapping, not yet validated) with its relative references resolved
    against `base_dir`; anything else is returned as is, for validation to refuse. The kind
    is read from its one key (`train:`; engine.config_kinds.one_key)."""
    data = one_key(data)
    if isinstance(data, dict) and "task" in data:
        data = {**data, "task": absolute_paths(data["task"], base_dir)}
    return _absolute_model(_absolute_init(data, base_dir), base_dir)


def _absolute_model(data: Any, base_dir: str | Path) -> Any:
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, str) or not model.startswith("module:"):
        return data
    target, sep, name = model.removeprefix("module:").rpartition(":")
    if sep and is_file_ref(target) and not Path(target).expanduser().is_absolute():
        data = {**data, "model": f"module:{(Path(base_dir) / target).resolve()}:{name}"}
    return data


def _absolute_init(data: Any, base_dir: str | Path) -> Any:
    train = data.get(KEY) if isinstance(data, dict) else None
    if isinstance(train, dict) and isinstance(train.get("init"), str) and train["init"]:
        init = Path(train["init"]).expanduser()
        data = {**data, KEY: {**train, "init": str(init if init.is_absolute() else Path(base_dir) / init)}}
    return data
