"""Rebuild and verify: the model at ``run@g`` is the base plus the ledger's replay.

Replay starts from the nearest valid anchor (a cache, checked by sha256 and fingerprint)
or from the base model (checked against the run's recorded base fingerprint), applies
every generation with ``update.apply_step`` (the code training used) and compares
fingerprints with the ledger's.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import torch

from seedledger.ledger.errors import SeedLedgerError, VerifyMismatch
from seedledger.ledger.names import printable
from seedledger.ledger.records import RunInfo

from . import paths
from .adapter import start_fingerprint
from .anchors import AnchorError, load_anchor, max_anchor_bytes
from .fingerprint import fingerprint
from .kinds import PerturbationKind, from_run, member_scale, step_kind
from .kinds.forms import MasterForm
from .rules import check_lineage_rules
from .update import OptimizerState, apply_step

Progress = Callable[[int, int], None]  # (generations done, generations to do)


def replay_steps(
    master: dict[str, torch.Tensor], steps: Iterable[Any], state: OptimizerState | None = None,
    *, expected: Mapping[int, str | None] | None = None, progress: Progress | None = None,
) -> tuple[dict[str, torch.Tensor], OptimizerState]:
    """Apply ``steps`` in order to ``master`` (in place); check ``expected[g]`` fingerprints."""
    state = state or OptimizerState()
    steps = list(steps)
    for done, step in enumerate(steps, 1):
        apply_step(master, state, step)
        want = expected.get(step.index) if expected else None
        if want is not None:
            got = fingerprint(master)
            if got != want:
                raise VerifyMismatch(
                    f"generation {step.index} of {step.run if hasattr(step, 'run') else 'the history'} "
                    f"does not replay: fingerprint {got}, the ledger says {want}",
                    generation=step.index,
                )
        if progress is not None:
            progress(done, len(steps))
    return master, state


def _lineage(ledger, run: str) -> list[RunInfo]:
    """The run and its ancestors, root first."""
    chain = [ledger.get_run(run)]
    while chain[-1].parent is not None:
        chain.append(ledger.get_run(chain[-1].parent[0]))
    return chain[::-1]


def _recorded_fingerprint(ledger, run: str, g: int, base_fp: str | None) -> str | None:
    return base_fp if g == 0 else ledger.generation(run, g).fingerprint


def _from_anchor(ledger, run: str, g: int, base: dict[str, torch.Tensor], anchors_dir, base_fp,
                 kinds: Mapping[int, PerturbationKind]):
    """(start generation, master, state) from the newest usable anchor at or before g.
    ``kinds[g]``: generation g's kind, which says the form of its master (a quantized one
    has other tensors than the base: ``PerturbationKind.master_names``)."""
    candidates = [a for a in ledger.anchors(run, lineage=True) if a.generation <= g]
    for info in sorted(candidates, key=lambda a: a.generation, reverse=True):
        try:
            want = _recorded_fingerprint(ledger, run, info.generation, base_fp)
            carried = len(kinds[info.generation].carried) if info.generation in kinds else 0  # quant_codes' residual
            limit = max_anchor_bytes(base, _buffers(ledger, info) + carried)
            master, state = load_anchor(info, anchors_dir, want, limit)
        except AnchorError as exc:
            warnings.warn(f"{exc}; falling back", RuntimeWarning, stacklevel=3)  # once: not logged too
            continue
        kind = kinds.get(info.generation)
        form = kind.master_names({n: tuple(t.shape) for n, t in base.items()}) if kind is not None else list(base)
        if set(master) not in (set(base), set(form)):
            warnings.warn(f"anchor {printable(info.run)}@{info.generation} has other tensors than the base; skipped",
                          RuntimeWarning, stacklevel=3)
            continue
        device = next(iter(base.values())).device if base else torch.device("cpu")
        if set(master) != set(base):  # a quantized master: the anchor's tensors, in its form's order
            base.clear()
            base.update({n: master[n].to(device).contiguous() for n in form})
        for name, t in base.items():  # reuse the caller's storage (and device)
            t.copy_(master[name])
        for bufs in state.buffers.values():
            for name in bufs:
                bufs[name] = bufs[name].to(device)
        return info.generation, base, state
    return None


def _buffers(ledger, info) -> int:
    """Optimizer buffers per tensor an anchor may hold: a `paths` record's path count, else 2."""
    opt = (ledger.generation(info.run, info.generation).optimizer or {}) if info.generation else {}
    if opt.get("name") != paths.NAME:
        return 2
    # Either form of the rule (decay: LM-MA-ES; mix/noise: a GA's survivors) bounds the
    # paths an anchor holds after the step: its move (paths before) or its rows (paths after).
    counts = [len(opt[k]) for k in ("move", "decay", "mix") if isinstance(opt.get(k), list)]
    return max(counts, default=2)


def rebuild(
    ledger, run: str, g: int | None, base: dict[str, torch.Tensor],
    verify: Literal["end", "every", "none"] = "end",
    anchors_dir: str | os.PathLike[str] | None = None, progress: Progress | None = None,
    frozen: str | None = None,
) -> tuple[dict[str, torch.Tensor], OptimizerState]:
    """The master and derived optimizer state at ``run@g`` (``g=None``: latest).

    ``base`` is consumed: its tensors are updated in place and returned. With
    ``anchors_dir=None`` no anchor is used. Adapter runs: ``base`` is the initial adapter
    and ``frozen`` the fingerprint of the frozen base as loaded (``replay.adapter``).
    Raises SeedLedgerError for a base that is not the run's, VerifyMismatch when a checked
    fingerprint differs, ChainBroken (a VerifyMismatch) when a row of the history no
    longer matches its hash-chain digest.
    """
    if verify not in ("end", "every", "none"):
        raise ValueError(f"verify must be 'end', 'every' or 'none', not {verify!r}")
    g = ledger.latest_generation(run) if g is None else g
    ledger.check_chain(run, g)  # rows edited outside seedledger: ChainBroken, before any work
    lineage = _lineage(ledger, run)
    kinds = {}
    for info in lineage:
        try:
            kinds[info.name] = from_run(info.noise_spec, info.param_selection)
        except SeedLedgerError as exc:
            raise SeedLedgerError(f"run {info.name!r}: {exc}") from None
    adapter = lineage_adapter(lineage, kinds)
    if (kinds[lineage[-1].name].master_form is MasterForm.ADAPTER) != (frozen is not None):
        raise ValueError(f"run {run!r}: pass `frozen` (the frozen base's fingerprint) exactly when it "
                         "trains an adapter")
    base_fp = lineage[0].base_fingerprint
    steps = ledger.replay_history(run, upto=g)  # also validates g
    check_lineage_rules(ledger, steps)  # a rule no run of its config records: refused before any state exists
    for s in steps:  # each step carries its own kind (its run's, or its own when imported)
        try:
            kind = from_run(s.noise_spec, s.param_selection)
        except SeedLedgerError as exc:
            raise SeedLedgerError(f"run {s.run!r} generation {s.index}: {exc}") from None
        if kind.adapter != adapter:
            raise SeedLedgerError(f"run {s.run!r} generation {s.index} trains other parameters "
                                  f"({s.param_selection}) than its lineage")

    at = {s.index: from_run(s.noise_spec, s.param_selection) for s in steps}
    start = _from_anchor(ledger, run, g, base, anchors_dir, base_fp, at) if anchors_dir is not None else None
    if start is None:
        got = start_fingerprint(base, frozen)
        if base_fp is not None and got != base_fp:
            raise SeedLedgerError(
                f"the base weights are not {lineage[0].base_model!r} as run {run!r} recorded it "
                f"(fingerprint {got}, expected {base_fp})"
            )
        start = (0, base, OptimizerState())
    start_g, master, state = start
    todo = [s for s in steps if s.index > start_g]

    expected: dict[int, str | None] = {}
    if verify == "every":
        expected = {s.index: ledger.generation(s.run, s.index).fingerprint for s in todo}
    elif verify == "end" and todo:
        expected = {g: ledger.generation(run, g).fingerprint}
    master, state = replay_steps(master, todo, state, expected=expected, progress=progress)
    try:  # a run whose kind cannot train what its lineage made (a fork leaving quant_scales)
        kinds[lineage[-1].name].check_master(master)
    except SeedLedgerError as exc:
        raise SeedLedgerError(
            f"run {run!r} ({kinds[lineage[-1].name].label}) cannot train its master at generation {g}: {exc}"
        ) from None
    return master, state


def lineage_adapter(lineage: list[RunInfo], kinds: Mapping[str, PerturbationKind]):
    """The LoRA spec every run of ``lineage`` trains (None: the whole model); a lineage
    whose runs train different parameters is refused (its masters are not comparable)."""
    adapters = {kinds[info.name].adapter for info in lineage}
    if len(adapters) > 1:
        raise SeedLedgerError(
            f"run {lineage[-1].name!r}: its lineage trains different parameters "
            f"({', '.join(sorted(kinds[i.name].param_selection for i in lineage))})"
        )
    return adapters.pop()


def verify(
    ledger, run: str, g: int | None, base: dict[str, torch.Tensor], *,
    anchors_dir: str | os.PathLike[str] | None = None, progress: Progress | None = None,
    frozen: str | None = None,
) -> str:
    """Replay every generation up to ``run@g`` checking each fingerprint; returns the last.

    Raises VerifyMismatch naming the first generation whose fingerprint differs.
    """
    master, _ = rebuild(ledger, run, g, base, verify="every", anchors_dir=anchors_dir, progress=progress,
                        frozen=frozen)
    return fingerprint(master)


def apply_member(master: dict[str, torch.Tensor], step: Any, key: int, sign: int, *,
                 member: int | None = None, state: OptimizerState | None = None) -> None:
    """``master`` (the generation's starting master, in place) → the member's genome
    ``master + sign·σ·ε(key)`` in ``step``'s perturbation kind: the fp32 weights the member
    was evaluated with (quant_codes: the dequantized master, noise on the targeted linears).
    Built by ``apply_step`` as a one-term SGD step (the same code every update runs); a
    sign-0 member (a GA's elite) takes no noise: the master itself, untouched, plus its path
    terms if it has any (a GA's surviving offset).

    A ``paths`` step (LM-MA-ES, a GA with survivors) scales the noise by its recorded α and
    then adds member ``member``'s path terms from ``state`` (the replay state at the
    generation's start)."""
    shrink, terms = 1.0, []
    if (step.optimizer or {}).get("name") == paths.NAME:
        if member is None or state is None:
            raise SeedLedgerError(
                f"generation {step.index}: a member of a paths generation needs its index and the replay state"
            )
        paths.settings(step.optimizer, step.index, len(step.keys))  # the whole rule, not just this row
        shrink, terms = paths.member_settings(step.optimizer, step.index, member)
    scale = member_scale(sign, step.sigma, shrink)
    try:
        pert = step_kind(step)
    except SeedLedgerError as exc:
        raise SeedLedgerError(f"generation {step.index}: {exc}") from None
    weights = pert.member_weights(master)  # quant_codes: the dequantized weights, noise on its targets only
    if weights is not master:
        master.clear()
        master.update(weights)
    if scale != 0.0:
        one = dataclasses.replace(step, keys=[key], coefficients=[scale], optimizer={"name": "sgd", "lr": 1.0})
        apply_step(master, OptimizerState(), one, perturbation=pert.member_kind)
    if terms:
        for name, theta in master.items():
            if pert.trained(name, theta.shape):
                paths.member_(theta, name, state, terms)
