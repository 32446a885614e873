"""``load_task(spec, seed)``: from a config's ``task`` value to a Task.

Spec forms (YAML or ``--set task=...``):
- ``"arithmetic"``, ``"countdown"`` — generated tasks;
- ``"countdown:PATH"``, ``"math:PATH"``, ``"jsonl:PATH"``, ``"code:PATH"`` — local files;
- ``"reasoning_gym:NAME"`` — a reasoning-gym generator; ``"code:humaneval"`` — HumanEval;
- ``"gym:ENV_ID"``, ``"fitness:pkg.mod:function"`` — a module run's tasks (``gym_task``,
  ``fitness_task``: they score a ``torch.nn.Module``, not completions);
- any of these with options: ``"jsonl:PATH?test_size=8&match=numeric"`` (``spec_options``;
  ``--set task.test_size=8`` on a string form means the same);
- a mapping ``{name: countdown, path: ..., test_size: 100, level: 2, rewards: [...]}``;
- a mix: ``{mix: [{task: arithmetic, weight: 0.7}, {task: "math:gsm8k.jsonl", weight: 0.3}]}``
  or the same list alone.

``rewards`` (optional) replaces the task's reward list; each item is ``"task"`` (the task's
own reward), ``"format"``, ``"length"``, ``"contains"`` (the reference answer in the text,
partial credit by brevity), ``"loglik"`` (the reference answer's likelihood,
``trainers.rewards.loglik``) or a user function ``"module:function"`` /
``"file.py:function"``, as a string or a mapping with ``fn``, ``weight``, ``name`` and, for
the built-ins, their options (``format``: think_start, think_end, answer_start,
answer_end, partial; ``length``: limit, unit, scale; ``contains``: column, partial,
casefold; ``loglik``: template, column);
``trainers.rewards.spec`` checks them.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic

from seedledger.ledger.errors import SeedLedgerError, did_you_mean
from seedledger.ledger.names import printable
from seedledger.trainers.rewards.combine import WeightedReward
from seedledger.trainers.rewards.contains import contains_reward
from seedledger.trainers.rewards.format import format_reward
from seedledger.trainers.rewards.length import length_penalty
from seedledger.trainers.rewards.loader import is_file_ref, load_reward_fn
from seedledger.trainers.rewards.loglik import LikelihoodReward
from seedledger.trainers.rewards.spec import BUILTIN, parse_rewards

from . import (
    arithmetic,
    code_task,
    countdown,
    fitness_task,
    gym_task,
    jsonl_task,
    math_task,
    reasoning_gym_task,
)
from .base import Task
from .mixture import MixtureTask
from .spec_options import expand

LOADERS: dict[str, Callable[..., Task]] = {
    "arithmetic": arithmetic.load,
    "countdown": countdown.load,
    "math": math_task.load,
    "jsonl": jsonl_task.load,
    "code": code_task.load,
    "reasoning_gym": reasoning_gym_task.load,
    "gym": gym_task.load,
    "fitness": fitness_task.load,
}
MODEL_TASKS = {"gym", "fitness"}
"""Tasks that score a whole ``torch.nn.Module`` (a module run's), not decoded text."""
_NOT_PATHS = {"reasoning_gym": None, "code": "humaneval", "gym": None, "fitness": None}
"""Tasks whose ``name:X`` names no file: every X (None), or this one X."""
_COMMON = {"name", "rewards", "weight"}
_BUILTIN_REWARDS = set(BUILTIN)  # names, not code
_LEVELED = {"arithmetic": len(arithmetic.LEVELS), "countdown": len(countdown.LEVELS)}


def absolute_paths(spec: Any, base_dir: str | Path) -> Any:
    """``spec`` with every relative dataset path and ``file.py:function`` reward file made
    absolute against ``base_dir`` (the config file's directory), so that a run's stored
    config loads the same files from any working directory. Absolute paths, module
    references and anything not understood are left as they are (``load_task`` judges)."""
    base = Path(base_dir)
    spec = expand(spec, LOADERS)  # "jsonl:PATH?test_size=8" and {name: "jsonl:PATH", ...}

    def fix(path: Any, task: Any = None) -> Any:
        if not isinstance(path, str) or not path or Path(path).is_absolute():
            return path
        if task in _NOT_PATHS and _NOT_PATHS[task] in (None, path):
            return path
        return str((base / path).resolve())

    if isinstance(spec, list):
        return [absolute_paths(item, base_dir) for item in spec]
    if isinstance(spec, str):
        name, sep, path = spec.partition(":")
        if name == "fitness" and path:  # a function reference: its file, if it names one
            return f"{name}:{_absolute_reward(path, fix)}"
        return f"{name}:{fix(path, name)}" if sep and name in LOADERS and path else spec
    if not isinstance(spec, dict):
        return spec
    out = dict(spec)
    if out.get("name") == "fitness" and isinstance(out.get("path"), str):
        out["path"] = _absolute_reward(out["path"], fix)
    if "mix" in out:
        out["mix"] = absolute_paths(out["mix"], base_dir)
    if "task" in out:
        out["task"] = absolute_paths(out["task"], base_dir)
    for key in ("path", "test_path"):
        if key in out:
            out[key] = fix(out[key], out.get("name") if key == "path" else None)
    if isinstance(out.get("rewards"), list):
        out["rewards"] = [_absolute_reward(item, fix) for item in out["rewards"]]
    return out


def _absolute_reward(item: Any, fix: Callable[[Any], Any]) -> Any:
    ref = item.get("fn") if isinstance(item, dict) else item
    if not isinstance(ref, str) or ref in _BUILTIN_REWARDS or ":" not in ref:
        return item
    target, _, attr = ref.rpartition(":")
    if not is_file_ref(target):
        return item
    fixed = f"{fix(target)}:{attr}"
    return {**item, "fn": fixed} if isinstance(item, dict) else fixed


def code_refs(spec: Any) -> list[str]:
    """Every reward reference in task ``spec`` that imports code (``module:function`` or
    ``file.py:function``; built-ins are not code), in order, without loading anything:
    what a stored config would make `resume` or `fork` import."""
    spec = expand(spec, LOADERS)
    if isinstance(spec, list):
        return [r for item in spec for r in code_refs(item)]
    if (isinstance(spec, str) and spec.startswith("fitness:")
            or isinstance(spec, dict) and spec.get("name") == "fitness"):
        return fitness_task.fitness_refs(spec)
    if not isinstance(spec, dict):
        return []
    out = code_refs(spec.get("mix")) + code_refs(spec.get("task"))
    rewards = spec.get("rewards")
    for item in rewards if isinstance(rewards, list) else []:
        ref = item.get("fn") if isinstance(item, dict) else item
        if isinstance(ref, str) and ref not in _BUILTIN_REWARDS:
            out.append(ref)
    return out


def is_model_task(spec: Any) -> bool:
    """Whether task ``spec`` scores a ``torch.nn.Module`` (``MODEL_TASKS``), without loading it."""
    spec = expand(spec, LOADERS)
    name = spec.partition(":")[0] if isinstance(spec, str) else spec.get("name") if isinstance(spec, dict) else None
    return name in MODEL_TASKS


def task_levels(spec: Any) -> int:
    """How many difficulty levels the task ``spec`` names, without loading any data (1 for
    file-backed tasks and mixes, which a curriculum cannot move)."""
    spec = expand(spec, LOADERS)
    if isinstance(spec, str):
        name, _, path = spec.partition(":")
        return 1 if path else _LEVELED.get(name, 1)
    if isinstance(spec, dict) and "mix" not in spec:
        name = spec.get("name")
        return 1 if spec.get("path") else _LEVELED.get(name, 1) if isinstance(name, str) else 1
    return 1


def load_task(spec: Any, seed: int = 0, base_dir: str | Path | None = None) -> Task:
    """A Task from a spec; ``seed`` is the run seed (batches use the seed passed to
    ``train_batch``; data generation and the split use the spec's ``data_seed``, default 0,
    so runs with different seeds share their test split). Relative dataset paths and
    reward files are taken from ``base_dir`` (``absolute_paths``), else as given."""
    if base_dir is not None:
        spec = absolute_paths(spec, base_dir)
    spec = expand(spec, LOADERS)
    if isinstance(spec, list):
        return _load_mix(spec, seed)
    if isinstance(spec, dict) and "mix" in spec:
        if set(spec) - {"mix"}:
            raise SeedLedgerError(f"task mix: unknown keys {sorted(set(spec) - {'mix'})}")
        return _load_mix(spec["mix"], seed)
    if isinstance(spec, str):
        name, _, path = spec.partition(":")
        opts: dict[str, Any] = {"path": path} if path else {}
    elif isinstance(spec, dict):
        opts = dict(spec)
        name = opts.pop("name", None)
        if not isinstance(name, str):
            raise SeedLedgerError(f"task {spec!r}: a mapping needs a 'name'")
    else:
        raise SeedLedgerError(f"task {spec!r}: expected a name, a mapping or a mix")
    if name not in LOADERS:
        raise SeedLedgerError(f"unknown task {name!r} (known: {', '.join(LOADERS)})")
    loader = LOADERS[name]
    _check_keys(name, opts)
    reward_spec = opts.pop("rewards", None)
    opts.pop("weight", None)
    opts["seed"] = seed
    task = loader(**opts)
    if reward_spec is not None:
        task.rewards = build_rewards(reward_spec, task.rewards)
    return task


class UnknownTaskOption(SeedLedgerError):
    """A task mapping's key that its loader does not take; `key_path` is where it is
    below the config's `task` (e.g. ``("mix", 0, "task", "tset_size")``)."""

    def __init__(self, message: str, key_path: tuple[str | int, ...]):
        super().__init__(message)
        self.key_path = key_path


def check_options(spec: Any, key_path: tuple[str | int, ...] = ()) -> None:
    """Every task mapping in ``spec`` (a mix's parts included) holds only keys its loader
    takes, without loading anything: the config's check, so that a typo is one line naming
    the key before any run or ledger exists. Unknown task names are left to ``load_task``."""
    spec = expand(spec, LOADERS)
    if isinstance(spec, list):
        for i, item in enumerate(spec):
            check_options(item, (*key_path, i))
    elif isinstance(spec, dict) and "mix" in spec:
        check_options(spec["mix"], (*key_path, "mix"))
    elif isinstance(spec, dict) and "task" in spec:  # a mix item {task: SPEC, weight: W}
        check_options(spec["task"], (*key_path, "task"))
    elif isinstance(spec, dict) and isinstance(spec.get("name"), str) and spec["name"] in LOADERS:
        _check_keys(spec["name"], {k: v for k, v in spec.items() if k != "name"}, key_path)


def _check_keys(name: str, opts: dict[str, Any], key_path: tuple[str | int, ...] = ()) -> None:
    """UnknownTaskOption for a key of task ``name``'s mapping its loader does not take, or a
    value of another type than its loader's annotation (a mapping where text goes, from a
    `--set task.system=a: b`, would otherwise fail inside the first generation)."""
    params = set(inspect.signature(LOADERS[name]).parameters) - {"unused"}
    unknown = sorted(set(map(str, opts)) - params - _COMMON)
    if unknown:
        shown = sorted(params - {"seed"})  # `rewards` included: every task takes one
        raise UnknownTaskOption(
            f"task {name}: unknown options {unknown}{did_you_mean(unknown[0], shown)}; allowed: {shown}",
            (*key_path, unknown[0]),
        )
    hints = typing.get_type_hints(LOADERS[name])
    for key, value in opts.items():
        if key in _COMMON or key in ("rewards", "seed") or key not in hints:
            continue  # rewards have their own check (trainers.rewards.spec)
        try:
            pydantic.TypeAdapter(hints[key]).validate_python(value, strict=True)
        except pydantic.ValidationError as exc:
            reason = exc.errors()[0]["msg"].lower()
            raise UnknownTaskOption(f"task {name}: option {key}: {reason}, not {printable(repr(value), limit=80)}",
                                    (*key_path, key)) from None


def _load_mix(items: Any, seed: int) -> Task:
    if not isinstance(items, list) or not items:
        raise SeedLedgerError("task mix: expected a non-empty list of {task, weight}")
    tasks, weights = [], []
    for item in items:
        if isinstance(item, dict) and "task" in item:
            sub, weight = item["task"], item.get("weight", 1.0)
        elif isinstance(item, dict):
            sub, weight = item, item.get("weight", 1.0)
        else:
            sub, weight = item, 1.0
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise SeedLedgerError(f"task mix: weight {weight!r} is not a number")
        if not 0 <= weight < math.inf:  # weight 0 keeps a task for held-out rows only
            raise SeedLedgerError(f"task mix: weight {weight!r} must be finite and >= 0")
        task = load_task(sub, seed)
        if isinstance(task, fitness_task.ModelTask):
            raise SeedLedgerError(f"task mix: {task.name} scores a whole model and cannot be mixed")
        if task.likelihood_rewards:
            raise SeedLedgerError(f"task mix: {task.name}: the loglik reward is not supported inside a mix")
        tasks.append(task)
        weights.append(float(weight))
    return MixtureTask(tasks, weights, seed=seed)


def build_rewards(
    spec: Any, task_rewards: list[WeightedReward]
) -> list[WeightedReward | LikelihoodReward]:
    """The reward list named by a config (see the module docstring), checked by
    `trainers.rewards.spec.parse_rewards` first."""
    out: list[WeightedReward | LikelihoodReward] = []
    for entry in parse_rewards(spec):
        if entry.ref == "task":
            out.extend(WeightedReward(r.name, r.fn, r.weight * entry.weight) for r in task_rewards)
            continue
        if entry.ref == "loglik":
            out.append(LikelihoodReward(entry.name, entry.weight, **entry.options))
            continue
        if entry.ref == "format":
            fn = format_reward(**entry.options)
        elif entry.ref == "length":
            fn = length_penalty(**entry.options)
        elif entry.ref == "contains":
            fn = contains_reward(**entry.options)
        else:
            fn = load_reward_fn(entry.ref)  # a file path is absolute by now (``absolute_paths``)
        out.append(WeightedReward(entry.name, fn, entry.weight))
    names = [r.name for r in out]
    if len(set(names)) != len(names):
        raise SeedLedgerError(f"rewards: component names repeat: {names} (give each a 'name')")
    return out


def reward_lists(spec: Any) -> list[Any]:
    """Every `rewards` list a task spec holds (a mix's parts included), unvalidated."""
    spec = expand(spec, LOADERS)
    if isinstance(spec, list):
        return [r for item in spec for r in reward_lists(item)]
    if not isinstance(spec, dict):
        return []
    if "mix" in spec:
        return reward_lists(spec["mix"])
    if "task" in spec:  # a mix item {task: SPEC, weight: W}
        return reward_lists(spec["task"])
    return [spec["rewards"]] if "rewards" in spec else []


def check_rewards(spec: Any) -> None:
    """Validate every `rewards` list of a task spec without importing any code
    (SeedLedgerError naming the entry): the config's check, before a run exists."""
    for rewards in reward_lists(spec):
        parse_rewards(rewards)


def uses_loglik(spec: Any) -> tuple[bool, bool]:
    """(any `rewards` list of task `spec` names `loglik`, every named list holds nothing
    else), without loading anything: the config's backend and sampling checks."""
    lists = reward_lists(spec)
    refs = [[(item.get("fn") if isinstance(item, dict) else item) for item in rewards]
            for rewards in lists if isinstance(rewards, list)]
    some = any("loglik" in r for r in refs)
    return some, some and all(set(r) == {"loglik"} for r in refs)
