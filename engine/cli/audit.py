"""Audit views of the ledger as plain JSON-able data: runs, generations, forks, inputs,
weight diffs (engine.cli.weight_diff).

Everything here reads the ledger only (plus replay for `diff`); rendering for humans lives in
`engine.cli.audit_render`, so `--json` and the tables always show the same facts.
"""

from __future__ import annotations

import math
from typing import Any

from seedledger.engine.cli.weight_diff import diff, recorded_fingerprint
from seedledger.ledger import EventInfo, Ledger, RunInfo
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.provenance import base_provenance, in_force, input_ranges, inputs_along
from seedledger.ledger.rows import wall_seconds

__all__ = ["diff", "fork_graph", "list_runs", "run_log", "show_generation", "show_member", "status"]

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
    """The run's status (engine.runtime.session.STATUSES); `training` only while a live process
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
    config = run.config if isinstance(run.config, dict) else {}
    return {
        "name": run.name,
        "base_model": run.base_model,
        "backend": config.get("backend"),
        "perturbation": perturbation(config),
        "generations": ledger.latest_generation(run.name),
        "own_generations": len(own),
        "status": status(ledger, run),
        "best_reward": best[0] if best else None,
        "best_generation": best[1] if best else None,
        "parent": f"{run.parent[0]}@{run.parent[1]}" if run.parent else None,
        "created_at": run.created_at.isoformat(),
    }


def perturbation(config: dict[str, Any]) -> str:
    """What a run's members perturb, from its stored config: `full`, `lowrank r=1`,
    `lora r=8`, `quant_codes`, ... (the `train` section where it is not `full`)."""
    for key in ("train", "perturbation"):
        section = config.get(key)
        if isinstance(section, dict):
            kind, rank = section.get("kind", key), section.get("rank")
            return f"{kind} r={rank}" if rank else str(kind)
        if section not in (None, "full"):
            return str(section)
    return "full"


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


def evaluations(ledger: Ledger, run: str) -> list[dict[str, Any]]:
    """The run's held-out evaluations (`evaluation` events, engine.runtime.scoring.heldout), oldest first."""
    keep = ("generation", "rows", "skip", "mean", "against", "against_mean", "change", "by")
    return [{"at": e.at.isoformat()} | {k: _strict(e.payload.get(k)) for k in keep}
            | {"mean": _strict(e.payload.get("mean", e.payload.get("held_out_reward"))),  # older demos'
               "imported": imported(e)}
            for e in ledger.events(run, "evaluation", imported=True)]


def imported(e: EventInfo) -> dict[str, Any] | None:
    """Where an imported event came from (the seed file's digest) and when its sender
    recorded it; None for this ledger's own (its `at` is when it was imported)."""
    if not e.imported:
        return None
    return {"from": e.origin, "sent_at": e.sent_at.isoformat() if e.sent_at else None}


def run_log(ledger: Ledger, ref: str, *, strict: bool = True) -> dict[str, Any]:
    """A run's lineage generation by generation (inherited ones name their run), up to G
    for `RUN@G`, read from the generation rows alone (`Ledger.summaries`). `strict`: event
    payloads as strict JSON (NaN as None), which walks all of them; the table, which shows
    a bounded line of each, passes False."""
    from seedledger.engine.refs import resolve_ref

    info, upto = resolve_ref(ledger, ref)
    run = info.name
    summaries = ledger.summaries(run, upto)
    rows = [summary_row(s) for s in summaries]
    ranges = input_ranges(ledger, run, upto)
    for row in rows:
        row["inputs"] = None
    for r in ranges:  # each row names the inputs it was trained on (None: not recorded)
        for row in rows:
            if r.first <= row["generation"] <= r.last:
                row["inputs"] = r.digest
    held_out = {e["generation"]: e["mean"] for e in evaluations(ledger, run)  # the latest per generation
                if isinstance(e["generation"], int)}
    for row in rows:
        row["held_out"] = held_out.get(row["generation"])
    events = [
        {"at": e.at.isoformat(), "kind": e.kind, "payload": _strict(e.payload) if strict else e.payload,
         "imported": imported(e)}
        for e in ledger.events(run, imported=True)
    ]
    return {"run": run_summary(ledger, info, summaries), "generations": rows, "events": events,
            "inputs": [r.to_json() for r in ranges]}


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
    from seedledger.engine.refs import resolve_ref

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
        "evaluations": evaluations(ledger, info.name),
        "backend": (info.config or {}).get("backend"),
        "perturbation": perturbation(info.config or {}),
        "inputs": inputs_at(ledger, info.name, g),
        "base_model": base_model(ledger, info),
    }


def inputs_at(ledger: Ledger, run: str, g: int) -> dict[str, Any] | None:
    """The inputs the session that trained `run@g` recorded (ledger.provenance; None: not
    recorded), without the base model's provenance (`base_model`)."""
    payload = in_force(inputs_along(ledger, run, g), g)
    return None if payload is None else _strict({k: v for k, v in payload.items() if k != "model"})


def base_model(ledger: Ledger, info: RunInfo) -> dict[str, Any]:
    """The run's base model: name, fingerprint and what it is (its recorded provenance)."""
    from seedledger.engine.api import describe_model

    provenance = base_provenance(ledger, info.name)
    return {"model": info.base_model, "fingerprint": info.base_fingerprint, "provenance": _strict(provenance),
            "description": describe_model(provenance)}


def show_member(ledger: Ledger, ref: str, with_samples: bool = False) -> dict[str, Any]:
    """`show RUN@G#M`: member M's row of generation G (key, sign, reward, components,
    coefficient), what its weights are (`RUN@G-1` plus sign·σ·ε(key) in the generation's
    perturbation kind, and the generation a GA member's weights equal), and what the
    algorithm recorded about it (GA: fitness, species, parent, child; CMA-ES: rank);
    `with_samples` adds its stored outputs."""
    from seedledger.engine.refs import format_ref, resolve_member

    info, g, index = resolve_member(ledger, ref)
    if index is None:
        raise SeedLedgerError(f"{ref!r}: expected a member, RUN@G#M")
    record = ledger.generation(info.name, g)
    m = record.members[index]
    holder = ledger.get_run(_holder(ledger.ancestors(info.name, g), g))
    parent = format_ref(info.name, g - 1)
    along = _paths(record.optimizer or {}, index)
    return {
        "run": info.name,
        "generation": g,
        "member": index,
        "ref": format_ref(info.name, g, index),
        "recorded_in": holder.name,
        "parent": parent,
        "parent_fingerprint": recorded_fingerprint(ledger, info, g - 1),
        "same_weights_as": _same_weights(info.name, g, m, record.extra, any(along.get("paths", {}).get("terms") or ())),
        "sigma": record.sigma,
        "perturbation": {
            "noise_spec": record.noise_spec or holder.noise_spec,
            "param_selection": record.param_selection or holder.param_selection,
        },
        **{k: v for k, v in _member(m, with_samples).items() if k != "index"},
        **_decision(record.extra, m),
        **along,
        "committed_at": record.committed_at.isoformat() if record.committed_at else None,
    }


def _same_weights(run: str, g: int, m, extra: dict[str, Any], offset: bool) -> str | None:
    """The generation whose master a member's weights are bit for bit, when the record
    says so: sign 0 without path terms (a GA's elite) is `RUN@G-1`; a GA child that did not
    cross over (with survivors: the best, the new master) is `RUN@G` (its coefficient is
    σ·sign, applied with lr 1, and its path terms are the move)."""
    if m.sign == 0 and not offset:
        return f"{run}@{g - 1}"
    ga = extra.get("ga")
    return f"{run}@{g}" if isinstance(ga, dict) and ga.get("child") == [m.index] else None


def _decision(extra: dict[str, Any], m) -> dict[str, Any]:
    """What a GA or CMA-ES generation recorded about member `m` (nothing for ES)."""
    index = m.index
    out: dict[str, Any] = {}
    ga = extra.get("ga")
    if isinstance(ga, dict):
        fitness, species = ga.get("fitness") or [], ga.get("species") or []
        out["ga"] = {
            "fitness": _num(fitness[index]) if index < len(fitness) else None,
            "species": species[index] if index < len(species) else None,
            "parent": index in (ga.get("parents") or []),
            "child": index in (ga.get("child") or []),
            "elite": m.sign == 0,
        }
        survivors, bred = ga.get("survivors"), ga.get("breeding")
        if isinstance(survivors, list) and survivors:  # a GA with survivors: which ones this member descends from
            mine = bred[index] if isinstance(bred, list) and index < len(bred) else None
            ok = isinstance(mine, list) and all(isinstance(p, list) and len(p) == 2 and
                                                all(isinstance(x, int | float) for x in p) for p in mine)
            out["ga"] |= {"survivor": index in survivors, "bred": mine if ok else None}
    for name in ("cmaes", "lmmaes"):
        cm = extra.get(name)
        if isinstance(cm, dict) and index in (cm.get("ranking") or []):
            rank = cm["ranking"].index(index)
            out[name] = {"rank": rank, "selected": rank < cm.get("mu", 0)}
    return out


def _paths(optimizer: dict[str, Any], index: int) -> dict[str, Any]:
    """A member's share of the generation's `paths` rule: α on its noise and its coefficient
    on each path (`replay.paths`: LM-MA-ES's evolution paths, a GA's survivor offsets)."""
    from seedledger.replay.paths import (
        NAME,  # lazily: replay imports torch, which `show` need not pay
    )

    rows = optimizer.get("members") if optimizer.get("name") == NAME else None
    if not isinstance(rows, list) or not 0 <= index < len(rows):
        return {}
    return {"paths": {"shrink": optimizer.get("shrink"), "terms": rows[index]}}
