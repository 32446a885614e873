"""Generation 0 of a module run (any `torch.nn.Module`), and its rebuilt output.

A module run's base is made by code (engine.runtime.models.module), and code named by a
ledger or seed file runs only when the user names it. So its base comes from, in order:

- `--base module:pkg.mod:factory` (the user's own code) or `--base FILE.safetensors` (a
  state dict of its parameters), named by the user;
- the run's generation-0 anchor: the base weights its first session wrote beside the
  ledger (`models.module.record_base`), data only, read with the anchors' checks.

Either is then checked against the run's base fingerprint (`Source.check_base`). The
rebuilt policy is written as `model.safetensors` (its parameters, fp32, named as
`named_parameters()` names them: `module.load_state_dict(..., strict=False)` loads it
beside the module's own buffers) with `seedledger.json`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from seedledger.engine.rebuild.sources import Source, Start
from seedledger.engine.runtime.dirs import anchors_dir
from seedledger.engine.runtime.models.module import (
    MODULE,
    MODULE_EVENT,
    build_module,
    master_of,
    module_dir,
)
from seedledger.ledger import Ledger, RunInfo
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.kinds import from_run

WEIGHTS = "model.safetensors"


@dataclass
class ModuleStart(Start):
    """Generation 0 of a module run; `write` puts the rebuilt parameters in a directory."""

    def write(self, staging: Path, master: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        save_file({n: t.detach().cpu().contiguous() for n, t in master.items()}, str(staging / WEIGHTS))


def module_start(src: Source, base: str | None, device: str = "cpu") -> ModuleStart:
    """Generation 0 of module run `src` (see the module docstring for where it comes from)."""
    kind = from_run(src.noise_spec, src.param_selection)
    where = module_dir(src.base_model)
    if base is not None:
        return ModuleStart(where, _named_base(base, device), kind=kind)
    ledger = getattr(src, "ledger", None)
    master = _anchored_base(ledger, src.run) if ledger is not None else None
    if master is None:
        raise SeedLedgerError(
            f"{src.what} was evolved from the torch.nn.Module that {src.base_model!r} makes: code named by a "
            "ledger or seed file runs only when you name it: pass --base module:pkg.mod:factory (or --base "
            "FILE.safetensors holding its parameters)")
    return ModuleStart(where, {n: t.to(device) for n, t in master.items()}, kind=kind)


def ledger_start(ledger: Ledger, info: RunInfo, device: str = "cpu") -> ModuleStart:
    """Generation 0 of module run `info` from the generation-0 anchor beside `ledger`: data
    only, no code runs (`diff`, `evaluate`); one line when the ledger has none."""
    master = _anchored_base(ledger, info.name)
    if master is None:
        raise SeedLedgerError(f"run {info.name}: its base weights are not beside the ledger (no generation-0 "
                              "anchor), and a module run's base is made by code: rebuild it with --base "
                              "module:pkg.mod:factory")
    kind = from_run(info.noise_spec, info.param_selection)
    return ModuleStart(module_dir(info.base_model), {n: t.to(device) for n, t in master.items()}, kind=kind)


def factory_check(ledger: Ledger, info: RunInfo, gen: int) -> dict | None:
    """For `verify` of a module run: is the factory its model names (code, found without
    importing it) still the one the session that trained `gen` recorded? The replay
    starts from the base beside the ledger and never runs that code, so without this a
    changed factory, which `resume` refuses, verified clean. None for other runs; else
    `status` (unchanged, changed, not found here, not recorded) and `text` in words."""
    if not info.base_model.startswith(MODULE):
        return None
    from seedledger.engine.runtime.models.cache import sha256_file
    from seedledger.engine.runtime.setup.inputs import factory_files
    from seedledger.ledger.provenance import Change, in_force, inputs_along

    what = f"factory {info.base_model}"
    files = (in_force(inputs_along(ledger, info.name, gen), gen) or {}).get("files")
    now = factory_files(info.base_model)
    if not isinstance(files, dict) or not any(str(p) in files for p in now):
        status = "not found here" if not now else "not recorded"
        return {"status": status, "text": f"{what}: {status} (not checked)"}
    changed = [Change("file", str(p), files[str(p)], sha256_file(p)) for p in now if str(p) in files]
    changed = [c for c in changed if c.before != c.after]
    if not changed:
        return {"status": "unchanged", "text": f"{what}: unchanged"}
    return {"status": "changed", "changes": [c.to_json() for c in changed],
            "text": f"{what} changed since {info.name}@{gen} was trained ({changed[0].line()}): the weights "
                    "replay from the base beside the ledger, but that code no longer makes the model they "
                    "were trained as (resume refuses it too)"}


def _named_base(base: str, device: str) -> dict[str, torch.Tensor]:
    if base.startswith(MODULE):
        return master_of(build_module(base, device))
    path = Path(base).expanduser()
    if path.suffix != ".safetensors" or not path.is_file():
        raise SeedLedgerError(f"--base {base!r}: a module run's base is module:pkg.mod:factory or a .safetensors file")
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path), device=device)
    except Exception as exc:  # safetensors' own errors: a damaged or foreign file
        raise SeedLedgerError(f"--base {base!r}: not a readable safetensors file ({exc})".splitlines()[0]) from None
    return {n: t.to(torch.float32).contiguous() for n, t in tensors.items()}


def _anchored_base(ledger, run: str) -> dict[str, torch.Tensor] | None:
    """The lineage root's generation-0 anchor (None when there is none). Nothing on this
    side knows the module's size (its factory is code, not run), and the shapes in the
    ledger's `module` event are the ledger's word: the read is bounded by both the shapes
    and the anchor file itself (replay.anchors.unsized_bound), whichever is less."""
    from seedledger.replay.anchors import AnchorError, load_anchor, unsized_bound

    found = [a for a in ledger.anchors(run, lineage=True) if a.generation == 0]
    if not found:
        return None
    info = found[0]
    events = ledger.events(info.run, MODULE_EVENT)
    if not events:
        return None
    elements = _claimed_elements(events[-1].payload.get("parameters"))
    root = ledger.get_run(info.run)
    bound = min(4 * elements + (1 << 20), unsized_bound(info.size)) if elements > 0 else unsized_bound(info.size)
    try:
        master, _ = load_anchor(info, anchors_dir(ledger), root.base_fingerprint, bound)
    except AnchorError as exc:
        raise SeedLedgerError(f"{run}: the base weights beside the ledger are unusable ({exc}); pass --base "
                              "module:pkg.mod:factory") from None
    return master


MAX_DIMS, MAX_DIM = 8, 1 << 40  # a tensor's shape as a module event records one


def _claimed_elements(parameters: object) -> int:
    """The elements the ledger's `module` event claims for its parameters, or 0 when they
    are not shapes (each at most MAX_DIMS sizes of at most MAX_DIM): 0 leaves the anchor
    file's own bound. Checked before any product: a ledger's shape of 200,000 sizes of
    2**62 made `math.prod` run for minutes (its cost grows with the square of the length)."""
    total = 0
    for entry in parameters if isinstance(parameters, list) else ():
        shape = entry[1] if isinstance(entry, list) and len(entry) == 3 else None
        if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(
                type(n) is int and 0 <= n <= MAX_DIM for n in shape):
            return 0
        total += math.prod(shape)
    return total
