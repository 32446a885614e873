"""Audit views of the ledger as plain JSON-able data: runs, generations, forks, weight diffs.

Everything here reads the ledger only (plus replay for `diff`); rendering for humans lives in
`engine.commands.audit_render`, so `--json` and the tables always show the same facts.
"""

from __future__ import annotations

import math
from typing import Any

from ledger import Ledger, RunInfo
from ledger.errors import SeedLedgerError
from ledger.rows import wall_seconds

FP_PREFIX = 12  # fingerprint characters shown in tables; JSON always carries all 32


def _num(x: float | None) -> float | None:
    """NaN (unknown reward) becomes None, so `--json` stays strict JSON."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return x


def _strict(obj: Any) -> Any:
    """Free-form data (samples, extra) with NaN/inf replaced by None, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_strict(v) for v in obj]
    return obj


def _own_range(ledger: Ledger, run: RunInfo) -> range:
    """The generations a run committed itself (a fork's start after its fork point)."""
    return range(run.parent_generation + 1, ledger.latest_generation(run.name) + 1)


def status(ledger: Ledger, run: RunInfo) -> str:
    """The run's status (engine.session.STATUSES); `training` only while a live process
    holds its writer lease: a killed session's run reads `interrupted`."""
    if run.status == "training" and ledger.live_writer(run.name) is None:
        return "interrupted"
    return run.status


def run_summary(ledger: Ledger, run: RunInfo, summaries: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One row of `log`: identity, size, status, best population-mean reward, parent
    (`summaries`: the run's `Ledger.summaries`, when the caller has them)."""
    best: tuple[float, int] | None = None
    own = _own_range(ledger, run)
    for s in summaries if summaries is not None else ledger.summaries(run.name):
        mean = _num(s["reward_mean"])
        if s["generation"] in own and mean is not None and (best is None or mean > best[0]):
            best = (mean, s["generation"])
    return {
        "name": run.name,
        "base_model": run.base_model,
        "generations": ledger.latest_generation(run.name),
        "own_generations": len(own),
        "status": status(ledger, run),
        "best_reward": best[0] if best else None,
        "best_generation": best[1] if best else None,
        "parent": f"{run.parent[0]}@{run.parent[1]}" if run.parent else None,
        "created_at": run.created_at.isoformat(),
    }


def list_runs(ledger: Ledger) -> list[dict[str, Any]]:
    """Every run, oldest first."""
    return [run_summary(ledger, r) for r in ledger.list_runs()]


def _holder(segments: list[tuple[str, int, int]], g: int) -> str:
    return next(run for run, first, last in segments if first <= g <= last)


def summary_row(s: dict[str, Any]) -> dict[str, Any]:
    """One row of `log RUN` from `Ledger.summaries`: rewards, hyperparameters, fingerprint, seconds."""
    return {
        "generation": s["generation"],
        "run": s["run"],
        "reward_mean": _num(s["reward_mean"]),
        "reward_max": _num(s["reward_max"]),
        "reward_min": _num(s["reward_min"]),
        "reward_std": _num(s["reward_std"]),
        "lr": s["lr"],
        "sigma": s["sigma"],
        "population": s["population"],
        "fingerprint": s["fingerprint"],
        "seconds": wall_seconds(s["timings"]),
        "committed_at": s["committed_at"].isoformat() if s["committed_at"] else None,
    }


def run_log(ledger: Ledger, ref: str) -> dict[str, Any]:
    """A run's lineage generation by generation (inherited ones name their run), up to G
    for `RUN@G`, read from the generation rows alone (`Ledger.summaries`)."""
    from engine.refs import resolve_ref

    info, upto = resolve_ref(ledger, ref)
    run = info.name
    summaries = ledger.summaries(run, upto)
    rows = [summary_row(s) for s in summaries]
    events = [
        {"at": e.at.isoformat(), "kind": e.kind, "payload": _strict(e.payload)}
        for e in ledger.events(run)
    ]
    return {"run": run_summary(ledger, info, summaries), "generations": rows, "events": events}


def fork_graph(ledger: Ledger) -> list[dict[str, Any]]:
    """The fork forest: each root run with its forks nested under `children`."""
    runs = ledger.list_runs()
    nodes = {
        r.name: {
            "name": r.name,
            "forked_at": r.parent[1] if r.parent else None,
            "generations": ledger.latest_generation(r.name),
            "status": status(ledger, r),
            "children": [],
        }
        for r in runs
    }
    roots = []
    for r in runs:
        parent = nodes.get(r.parent[0]) if r.parent else None
        (parent["children"] if parent is not None else roots).append(nodes[r.name])
    return roots


def _member(m, with_samples: bool) -> dict[str, Any]:
    out = {
        "index": m.index,
        "key": f"{m.key:016x}",  # a string, as tables print it: JSON numbers lose 64-bit precision
        "sign": m.sign,
        "reward": _num(m.reward),
        "components": {k: _num(v) for k, v in m.components.items()},
        "coefficient": m.coefficient,
    }
    if with_samples:
        out["samples"] = _strict(m.samples)
    return out


def show_generation(
    ledger: Ledger, ref: str, samples_member: int | str | None = None
) -> dict[str, Any]:
    """Everything `RUN@G` committed; `samples_member` (an index or "all") adds stored outputs."""
    from engine.refs import resolve_ref

    info, g = resolve_ref(ledger, ref)
    if g < 1:
        raise SeedLedgerError(f"{info.name}@0 is the base model: it has no generation record")
    record = ledger.generation(info.name, g)
    if samples_member not in (None, "all") and not (
        isinstance(samples_member, int) and 0 <= samples_member < len(record.members)
    ):
        raise SeedLedgerError(
            f"member {samples_member!r} does not exist; {info.name}@{g} has members "
            f"0..{len(record.members) - 1}"
        )
    members = []
    for m in record.members:
        wanted = samples_member == "all" or samples_member == m.index
        members.append(_member(m, with_samples=wanted))
    return {
        "run": info.name,
        "generation": g,
        "recorded_in": _holder(ledger.ancestors(info.name, g), g),
        "hyperparameters": {
            "lr": record.lr,
            "sigma": record.sigma,
            "population": record.population,
            "optimizer": record.optimizer,
            "schedule_step": record.schedule_step,
        },
        "batch_indices": record.batch_indices,
        "reward": {k: _num(v) for k, v in record.reward_stats().items()},
        "members": members,
        "fingerprint": record.fingerprint,
        "timings": _strict(record.timings),
        "seconds": wall_seconds(record.timings),
        "extra": _strict(record.extra),
        "committed_at": record.committed_at.isoformat() if record.committed_at else None,
    }


# ---------------------------------------------------------------------------------- diff


def _common_prefix(a: list, b: list) -> int:
    """How many leading replay steps two lineages share (same run, generation, content)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if (x.run, x.index, x.keys, x.coefficients) != (y.run, y.index, y.keys, y.coefficients):
            break
        n += 1
    return n


def _recorded(ledger: Ledger, info: RunInfo, g: int) -> str | None:
    """The fingerprint the ledger holds for `run@g` (the base's for g = 0)."""
    return ledger.generation(info.name, g).fingerprint if g else info.base_fingerprint


def _replay_pair(ledger: Ledger, a: tuple[RunInfo, int], b: tuple[RunInfo, int], device: str):
    """Masters at both refs, replaying their shared prefix once; every result is checked
    against the ledger's fingerprint (replay raises VerifyMismatch otherwise)."""
    import copy

    from engine.models import resolve_model
    from engine.rebuilding import load_base_master
    from engine.session import anchors_dir
    from replay.rebuild import rebuild, replay_steps
    from replay.update import OptimizerState

    (run_a, g_a), (run_b, g_b) = a, b
    if run_a.base_fingerprint != run_b.base_fingerprint:
        raise SeedLedgerError(
            f"{run_a.name} and {run_b.name} start from different base models "
            f"({run_a.base_model}, {run_b.base_model}): diff compares runs of one base"
        )
    base = load_base_master(resolve_model(run_a.base_model), device)
    steps_a = ledger.replay_history(run_a.name, upto=g_a)
    steps_b = ledger.replay_history(run_b.name, upto=g_b)
    k = _common_prefix(steps_a, steps_b)
    anchors = anchors_dir(ledger)
    if k:  # rebuild consumes (and checks) the base; may start from an anchor
        last = steps_a[k - 1]
        prefix, state = rebuild(ledger, last.run, last.index, base, verify="end", anchors_dir=anchors)
    else:
        prefix, state = base, OptimizerState()

    def finish(steps: list, info: RunInfo, g: int) -> dict:
        if len(steps) == k:
            return prefix
        if k == 0:  # nothing shared: a plain rebuild from a copy of the base
            master = {n: t.clone() for n, t in base.items()}
            return rebuild(ledger, info.name, g, master, verify="end", anchors_dir=anchors)[0]
        master = {n: t.clone() for n, t in prefix.items()}
        want = {g: _recorded(ledger, info, g)}
        return replay_steps(master, steps[k:], copy.deepcopy(state), expected=want)[0]

    return finish(steps_a, run_a, g_a), finish(steps_b, run_b, g_b), k


def diff(ledger: Ledger, ref_a: str, ref_b: str, device: str = "cpu") -> dict[str, Any]:
    """Per-tensor L2 norm and max |Δ| of (B − A), by replay, largest first, with a total."""
    import torch

    from engine.refs import resolve_ref

    a = resolve_ref(ledger, ref_a)
    b = resolve_ref(ledger, ref_b)
    master_a, master_b, shared = _replay_pair(ledger, a, b, device)
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
    return {
        "a": {"run": a[0].name, "generation": a[1], "fingerprint": _recorded(ledger, *a)},
        "b": {"run": b[0].name, "generation": b[1], "fingerprint": _recorded(ledger, *b)},
        "shared_generations": shared,
        "tensors": tensors,
        "total": {
            "l2": math.sqrt(sq_total),
            "max_abs": max_total,
            "changed": changed_total,
            "numel": numel_total,
            "tensors": len(tensors),
        },
    }
