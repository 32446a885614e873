"""Any `torch.nn.Module` as a run's model: how a config names it, and its fp32 master.

A config's `model` names a module run's model as code, never as weights:

- `module:pkg.mod:factory` (or `module:/abs/file.py:factory`): a zero-argument callable
  returning the `nn.Module`, imported like a reward function (trainers.rewards.loader), so
  a stored one runs on `resume`/`fork` only with --trust-code (engine.runtime.setup.stored_code);
- `in-process:NAME`: an object handed to `seedledger.evolve` in this process (a module, or
  a factory defined in a notebook); nothing is imported, and a later process can continue
  the run only by handing it to `evolve` again (`bound`).

A factory is called under torch's RNG seeded with `FACTORY_SEED` (forked: the caller's RNG
is untouched), so `nn.Linear`'s default init gives the same weights in every process: the
run's base fingerprint checks it. The master is every parameter `named_parameters()` gives
(tied ones once), fp32 and contiguous, in that order; buffers are the module's own.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import json
from pathlib import Path
from typing import Any

from seedledger.engine.config import is_module_model
from seedledger.engine.runtime.models.cache import models_dir
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.tasks.fitness_task import IN_PROCESS, in_process

MODULE = "module:"
FACTORY_SEED = 0
__all__ = ["FACTORY_SEED", "IN_PROCESS", "MODULE", "MODULE_EVENT", "bound", "build_module", "describe",
           "is_module_model", "master_of", "module_dir", "record_base", "ref_of", "stored_refs"]


def stored_refs(model: Any) -> list[str]:
    """The code a stored `model` would import (engine.runtime.setup.stored_code): a `module:` ref."""
    return [model] if isinstance(model, str) and model.startswith(MODULE) else []


def ref_of(obj: Any, what: str) -> str:
    """How a config names `obj` (`what`: "model" or a fitness): `module:pkg.mod:name` /
    `pkg.mod:name` when it is importable under that name from a real module, else
    `in-process:NAME`."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and name and module != "__main__" and name.isidentifier():
        with contextlib.suppress(Exception):
            if getattr(importlib.import_module(module), name) is obj:
                return f"{MODULE}{module}:{name}" if what == "model" else f"{module}:{name}"
    label = name if isinstance(name, str) else type(obj).__name__
    return f"{IN_PROCESS}{label}"


bound = in_process  # `in-process:` refs resolve to these objects while the block runs


def _load(ref: str) -> Any:
    from seedledger.trainers.tasks.fitness_task import load_object

    return load_object(ref.removeprefix(MODULE), "model")


def build_module(ref: str, device: str = "cpu") -> Any:
    """The `nn.Module` that `ref` names, in eval mode on `device` (a copy of an in-process
    module; a factory called under `FACTORY_SEED`)."""
    import torch

    obj = _load(ref)
    if isinstance(obj, torch.nn.Module):
        module = copy.deepcopy(obj)
    elif callable(obj):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(FACTORY_SEED)
            try:
                module = obj()
            except Exception as exc:
                why = f"model {ref!r}: the factory raised {type(exc).__name__}: {exc}"
                raise SeedLedgerError(why.splitlines()[0]) from exc
    else:
        raise SeedLedgerError(f"model {ref!r}: not an nn.Module or a function returning one")
    if not isinstance(module, torch.nn.Module):
        raise SeedLedgerError(f"model {ref!r}: the factory returned {type(module).__name__}, not a torch.nn.Module")
    if not any(True for _ in module.parameters()):
        raise SeedLedgerError(f"model {ref!r}: the module has no parameters to train")
    return module.to(device).eval()


def master_of(module: Any) -> dict[str, Any]:
    """The fp32 master: every parameter, named as `named_parameters()` names them."""
    import torch

    return {n: p.detach().to(torch.float32).clone().contiguous() for n, p in module.named_parameters()}


def describe(module: Any) -> dict[str, list]:
    """What is trained and what is not, for the run's `module` event: [name, shape, dtype]
    per parameter (all trained) and per buffer (the module's own, never changed)."""
    def rows(items) -> list:
        return [[n, list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in items]

    return {"parameters": rows(module.named_parameters()), "buffers": rows(module.named_buffers())}


def module_dir(ref: str) -> Path:
    """The model directory a module run resolves to: no weights (the factory makes them),
    one small `module.json` naming the ref, so that the session's directory-based steps
    (provenance, tokenizer files: none) have somewhere to look."""
    digest = hashlib.sha256(ref.encode()).hexdigest()[:16]
    path = models_dir() / "modules" / digest
    note = path / "module.json"
    if not note.is_file():
        path.mkdir(parents=True, exist_ok=True)
        note.write_text(json.dumps({"model": ref}) + "\n")
    return path.resolve()


MODULE_EVENT = "module"


def record_base(ledger: Any, run: str, ref: str, directory: Path) -> None:
    """A new module run's `module` event (its model ref, and [name, shape, dtype] of every
    trained parameter and every buffer) and its base weights as the generation-0 anchor, so
    that `verify` and `rebuild` of this ledger need no code (engine.rebuild.sources); a
    seed file elsewhere is rebuilt on a base the user names (`--base module:...`)."""
    from seedledger.replay.anchors import save_anchor

    module = build_module(ref)
    ledger.log_event(run, MODULE_EVENT, {"model": ref, **describe(module)})
    save_anchor(ledger, run, 0, master_of(module), None, directory)
