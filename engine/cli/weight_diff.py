"""`diff`: two models rebuilt by replay (sharing their common prefix), compared tensor by
tensor. Either side may be a member, `RUN@G#M`. A module run's base is its generation-0
anchor (engine.rebuild.module_start.ledger_start), so no code runs for it, as in `verify`.
engine.cli.audit re-exports `diff`."""

from __future__ import annotations

import math
from typing import Any

from seedledger.ledger import Ledger, RunInfo
from seedledger.ledger.errors import SeedLedgerError


def _common_prefix(a: list, b: list) -> int:
    """How many leading replay steps two lineages share (same run, generation, content)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if (x.run, x.index, x.keys, x.coefficients) != (y.run, y.index, y.keys, y.coefficients):
            break
        n += 1
    return n


def recorded_fingerprint(ledger: Ledger, info: RunInfo, g: int) -> str | None:
    """The fingerprint the ledger holds for `run@g` (the base's for g = 0)."""
    return ledger.generation(info.name, g).fingerprint if g else info.base_fingerprint


def _replay_pair(ledger: Ledger, a: tuple[RunInfo, int], b: tuple[RunInfo, int],
                 device: str) -> tuple[tuple[dict, Any], tuple[dict, Any], int]:
    """(master, replay state) at both refs, replaying their shared prefix once, and the
    prefix length; every result is checked against the ledger's fingerprint (replay raises
    VerifyMismatch otherwise)."""
    import copy

    from seedledger.engine.api import anchors_dir
    from seedledger.engine.config import is_module_model
    from seedledger.engine.rebuild.module_start import ledger_start
    from seedledger.engine.rebuild.rebuilding import load_start
    from seedledger.replay.rebuild import rebuild, replay_steps
    from seedledger.replay.update import OptimizerState

    (run_a, g_a), (run_b, g_b) = a, b
    if run_a.base_fingerprint != run_b.base_fingerprint:
        raise SeedLedgerError(
            f"{run_a.name} and {run_b.name} start from different base models "
            f"({run_a.base_model}, {run_b.base_model}): diff compares runs of one base"
        )
    start = (ledger_start(ledger, run_a, device) if is_module_model(run_a.base_model)  # the anchor: no code
             else load_start(run_a.base_model, run_a.config, run_a.noise_spec, run_a.param_selection, device))
    base, frozen = start.master, start.frozen
    steps_a = ledger.replay_history(run_a.name, upto=g_a)
    steps_b = ledger.replay_history(run_b.name, upto=g_b)
    k = _common_prefix(steps_a, steps_b)
    if k == 0 and run_a.base_fingerprint and start.fingerprint != run_a.base_fingerprint:
        raise SeedLedgerError(  # rebuild checks it otherwise; two sides at @0 (members of @1) would not
            f"the base weights are not {run_a.base_model!r} as run {run_a.name!r} recorded it"
        )
    anchors = anchors_dir(ledger)
    if k:  # rebuild consumes (and checks) the base; may start from an anchor
        last = steps_a[k - 1]
        prefix, state = rebuild(ledger, last.run, last.index, base, verify="end", anchors_dir=anchors,
                                frozen=frozen)
    else:
        prefix, state = base, OptimizerState()

    def finish(steps: list, info: RunInfo, g: int) -> tuple[dict, OptimizerState]:
        if len(steps) == k:
            return prefix, state
        if k == 0:  # nothing shared: a plain rebuild from a copy of the base
            master = {n: t.clone() for n, t in base.items()}
            return rebuild(ledger, info.name, g, master, verify="end", anchors_dir=anchors, frozen=frozen)
        master = {n: t.clone() for n, t in prefix.items()}
        want = {g: recorded_fingerprint(ledger, info, g)}
        return replay_steps(master, steps[k:], copy.deepcopy(state), expected=want)

    return finish(steps_a, run_a, g_a), finish(steps_b, run_b, g_b), k


MEMBER_NOTE = ("a member has no fingerprint in the ledger: its fingerprint here is computed from "
               "its rebuilt weights (RUN@G-1, checked, plus its perturbation)")


def _member_weights(ledger: Ledger, info: RunInfo, g: int, index: int, parent: tuple[dict, Any]) -> dict:
    """Member `index` of `run@g` built on a copy of `parent` (the checked `run@g-1` and its
    replay state, which the other side of a diff may share), as `rebuild` builds it (an
    member of a `paths` generation reads its paths from the state)."""
    from seedledger.engine.rebuild.sources import add_member

    master = {n: t.clone() for n, t in parent[0].items()}
    add_member(ledger, info.name, g, index, master, parent[1])
    return master


def _side(ledger: Ledger, info: RunInfo, g: int, member: int | None, master: dict) -> dict[str, Any]:
    """One side of a diff: what it names and its fingerprint (a member's computed)."""
    from seedledger.replay.fingerprint import fingerprint

    out: dict[str, Any] = {"run": info.name, "generation": g}
    if member is None:
        return out | {"fingerprint": recorded_fingerprint(ledger, info, g)}
    return out | {"member": member, "fingerprint": fingerprint(master),
                  "parent_fingerprint": recorded_fingerprint(ledger, info, g - 1)}


def diff(ledger: Ledger, ref_a: str, ref_b: str, device: str = "cpu") -> dict[str, Any]:
    """Per-tensor L2 norm and max |Δ| of (B − A), by replay, largest first, with a total.
    Either side may be a member, `RUN@G#M`: its parent `RUN@G-1` is replayed (sharing the
    common prefix) and checked, then the member's perturbation is added to a copy."""
    import torch

    from seedledger.engine.refs import resolve_member
    from seedledger.replay import quant

    (run_a, g_a, m_a), (run_b, g_b, m_b) = resolve_member(ledger, ref_a), resolve_member(ledger, ref_b)
    a = (run_a, g_a if m_a is None else g_a - 1)
    b = (run_b, g_b if m_b is None else g_b - 1)
    side_a, side_b, shared = _replay_pair(ledger, a, b, device)
    master_a = side_a[0] if m_a is None else _member_weights(ledger, run_a, g_a, m_a, side_a)
    master_b = side_b[0] if m_b is None else _member_weights(ledger, run_b, g_b, m_b, side_b)
    # a quantized master (int8 codes + scales, replay.quant) compares as the weights it stands for
    master_a, master_b = quant.dequantized(master_a), quant.dequantized(master_b)
    tensors = []
    sq_total = 0.0
    max_total = 0.0
    changed_total = 0
    numel_total = 0
    with torch.no_grad():
        for name, ta in master_a.items():
            d = (master_b[name].double() - ta.double()).abs_()  # float64 keeps tiny differences
            l2 = float(torch.linalg.vector_norm(d))
            mx = float(d.max()) if d.numel() else 0.0
            changed = int(torch.count_nonzero(d))
            tensors.append({
                "tensor": name,
                "shape": list(ta.shape),
                "numel": ta.numel(),
                "l2": l2,
                "max_abs": mx,
                "changed": changed,
            })
            sq_total += l2 * l2
            max_total = max(max_total, mx)
            changed_total += changed
            numel_total += ta.numel()
    tensors.sort(key=lambda t: (-t["l2"], -t["max_abs"], t["tensor"]))
    notes = [MEMBER_NOTE] if (m_a, m_b) != (None, None) else []
    return {
        "a": _side(ledger, run_a, g_a, m_a, master_a),
        "b": _side(ledger, run_b, g_b, m_b, master_b),
        "shared_generations": shared,
        "notes": notes,
        "tensors": tensors,
        "total": {
            "l2": math.sqrt(sq_total),
            "max_abs": max_total,
            "changed": changed_total,
            "numel": numel_total,
            "tensors": len(tensors),
        },
    }
