"""`seedledger attribute`: why a model answers as it does, from its ledger.

Three questions about a set of audited rows (`attribute_probe`), answered from one replay
pass along the lineage (`attribute_walk`: every generation applied once and verified, the
model scored at checkpoints, counterfactuals branched off on the way):

1. When did it learn it: the metric at generation 0, every K and the last.
2. Which generations did it: for each g, the metric at the end with g's coefficients
   zeroed (exact for every update rule: the replay of a history whose generation g moved
   nothing), its effect = metric − metric without g, ranked; beside it the first-order
   estimate from the curve alone, metric(g) − metric(g − 1), and the rank correlation of
   the two (how far the curve's jumps explain the exact effects).
3. Which training rows did it: (a) replay counterfactual, for each row r seen: every
   generation that drew r re-weighted without it (`attribute_rows`), later coefficients as
   recorded, replayed exactly; effect = metric − metric without r, ranked; (b) retrain
   counterfactual for chosen rows (`attribute_retrain`): a fork without r trained to the
   end, and whether its effect has the replay's sign.

Subtracting generation g's update from the final weights would not give (2) exactly, even
for SGD: θ_g = fl(θ_{g−1} + u_g) rounds, and later sums round again, so θ_G − u_g differs
from the replay without g in the last bits (measured in tests/test_attribute.py); the
zeroed replay is exact and costs G − g + 1 updates per generation.
"""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from seedledger.engine.config import validate
from seedledger.engine.rebuild import attribute_probe as probes
from seedledger.engine.rebuild import attribute_rows, attribute_walk
from seedledger.engine.rebuild.attribute_retrain import retrain as retrain_row
from seedledger.engine.refs import resolve_ref
from seedledger.engine.runtime.models.resolve import resolve_model
from seedledger.engine.runtime.scoring.evaluator import Evaluator, _prompt_text
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.shaping import mean_ranks
from seedledger.trainers.tasks import load_task


@dataclass
class Attribution:
    """What `attribute` found (see the module docstring); `to_dict` is its --json."""

    run: str
    generation: int
    probe: dict[str, Any]
    curve: list[dict[str, Any]]  # {generation, metric, fingerprint}
    generations: list[dict[str, Any]] | None = None  # ranked by effect
    agreement: float | None = None  # Spearman ρ of exact effects and first-order estimates
    training_rows: list[dict[str, Any]] | None = None  # ranked by effect
    retrain: list[dict[str, Any]] | None = None
    sign_agreement: dict[str, int] | None = None  # {agree, rows}: replay vs retrain effects
    cost: dict[str, float] = field(default_factory=dict)  # seconds, updates, peak_rss_mib

    @property
    def metric(self) -> float:
        return self.curve[-1]["metric"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def attribute(
    ledger: Ledger, ref: str, *, rows: str | None = None, held_out: int | None = None, skip: int = 0,
    prompt: str | None = None, answer: str | None = None, instead: str | None = None,
    instead_column: str | None = None, by: probes.Metric = "likelihood", every: int = 1,
    generations: bool = False, training_rows: bool | list[int] = False, retrain: list[int] = (),
    into: str | None = None, trust_code: bool = False, progress: attribute_walk.Progress | None = None,
) -> Attribution:
    """Audit `ref` (RUN or RUN@G) on the rows one of `rows` (a file), `held_out` (the task's
    first held-out rows after `skip`) or `prompt` + `answer` names (default: the first 8
    held-out rows); `instead` (with `prompt`) or `instead_column` (with rows) makes the
    metric a preference: the answer's likelihood less the alternative's. `training_rows`:
    True for every row the lineage drew, or a list of rows."""
    from seedledger.engine.runtime.setup.stored_code import check_stored_code, stored_code

    started = time.perf_counter()
    info, upto = resolve_ref(ledger, ref)
    check_stored_code(stored_code(info.config), f"run {info.name}", trust_code)
    if upto < 1 or every < 1:
        raise SeedLedgerError(f"attribute: {info.name}@{upto} has no generations to audit" if upto < 1
                              else "attribute: --every must be at least 1")
    if retrain and into is not None and len(retrain) > 1:
        raise SeedLedgerError("attribute: --into names one counterfactual run; retrain one row at a time with it")
    cfg = validate(info.config, f"run {info.name} config")
    task = load_task(cfg.task, seed=cfg.seed)
    probe = _probe(task, rows, held_out, skip, prompt, answer, by)
    if instead is not None and prompt is None:
        raise SeedLedgerError("attribute: --instead goes with --prompt (rows name theirs with --instead-column)")
    if instead is not None or instead_column is not None:
        if instead_column is not None and prompt is not None:
            raise SeedLedgerError("attribute: a --prompt names its alternative with --instead")
        probe = probe.with_instead([instead] if instead is not None else instead_column)
        probes.alternatives(task, probe)  # a missing column: refused before the model loads
    history, seen = None, {}
    if training_rows or retrain:  # refusals before the model loads
        history = attribute_rows.generations(ledger, info.name, upto)
        seen = attribute_rows.seen(history)
    chosen = _chosen_rows(training_rows, retrain, seen)
    evaluator = Evaluator(cfg, resolve_model(cfg.model), task=task)
    base = {n: t.clone() for n, t in evaluator.master.items()}
    score = probes.scorer(evaluator, probe)
    population = {r.index: r.population for r in ledger.records(info.name, upto=upto)} if generations else {}
    branches = [attribute_walk.Branch(("g", g), {g: [0.0] * n}) for g, n in population.items()]
    branches += [attribute_walk.Branch(("row", r), attribute_rows.without(history, r)) for r in chosen]
    checkpoints = set(range(0, upto + 1)) if generations else {*range(0, upto + 1, every), upto}
    curve, outcomes = attribute_walk.walk(ledger, info.name, upto, {n: t.clone() for n, t in base.items()}, score,
                                          checkpoints=checkpoints, branches=branches, frozen=evaluator.frozen,
                                          progress=progress)
    points = {g: probes.mean(s.rows) for g, s in curve.items()}
    final = points[upto]
    result = Attribution(info.name, upto, probe.describe(),
                         [{"generation": g, "metric": points[g], "fingerprint": curve[g].fingerprint}
                          for g in sorted(curve)])
    if generations:
        result.generations = _ranked([
            {"generation": g, "without": probes.mean(outcomes["g", g].rows), "first_order": points[g] - points[g - 1],
             "fingerprint": outcomes["g", g].fingerprint} for g in population], final)
        result.agreement = rank_correlation([e["effect"] for e in result.generations],
                                            [e["first_order"] for e in result.generations])
    if chosen:
        result.training_rows = _ranked([
            {"row": r, **_row_text(task, r), "seen": seen[r], "without": probes.mean(outcomes["row", r].rows),
             "fingerprint": outcomes["row", r].fingerprint} for r in chosen], final)
    if retrain:
        result.retrain = _retrained(ledger, info.name, upto, list(retrain), seen, base, score, final, result,
                                    into, trust_code, evaluator.frozen)
        agree = sum(e["agree"] for e in result.retrain)
        result.sign_agreement = {"agree": agree, "rows": len(result.retrain)}
    updates = upto + sum(upto - b.start + 1 for b in branches)
    result.cost = {"seconds": time.perf_counter() - started, "updates": updates, "scorings": len(curve) + len(branches),
                   "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    return result


def _probe(task: Any, rows: str | None, held_out: int | None, skip: int, prompt: str | None,
           answer: str | None, by: probes.Metric) -> probes.Probe:
    given = [name for name, v in (("--rows", rows), ("--held-out", held_out), ("--prompt", prompt)) if v is not None]
    if len(given) > 1:
        raise SeedLedgerError(f"attribute: audit one set of rows, not {' and '.join(given)}")
    if (prompt is None) != (answer is None):
        raise SeedLedgerError("attribute: --prompt and --answer go together")
    if prompt is not None:
        if by != "likelihood":
            raise SeedLedgerError("attribute: a --prompt and its --answer are audited by likelihood")
        return probes.from_prompt(task, prompt, answer)
    if rows is not None:
        return probes.from_file(rows, by)
    return probes.held_out(task, min(8, task.held_out_size - skip) if held_out is None else held_out, skip, by)


def _chosen_rows(training_rows: bool | list[int], retrain: list[int], seen: dict[int, list[int]]) -> list[int]:
    """The training rows to re-weight: every row seen, or those named (and every retrained row)."""
    named = list(seen) if training_rows is True else list(training_rows or [])
    for r in [*named, *retrain]:
        if r not in seen:
            raise SeedLedgerError(f"attribute: training row {r} is in no batch of the audited generations")
    return list(dict.fromkeys([*named, *retrain]))


def _row_text(task: Any, row: int) -> dict[str, Any]:
    """A training row as the report shows it: its question and answer cell."""
    data = task.train_rows()[row]
    return {"question": _prompt_text(task.prompt(data)), "answer": data.get("answer")}


def _ranked(entries: list[dict[str, Any]], final: float) -> list[dict[str, Any]]:
    """`entries` with effect = final − without, largest effect first (ties by their order)."""
    for e in entries:
        e["effect"] = final - e["without"]
    return sorted(entries, key=lambda e: -e["effect"])


def _retrained(ledger: Ledger, run: str, upto: int, rows: list[int], seen: dict[int, list[int]], base: dict,
               score: Any, final: float, result: Attribution, into: str | None, trust_code: bool,
               frozen: str | None) -> list[dict[str, Any]]:
    """Each row's retrain counterfactual beside its replay counterfactual."""
    replayed = {e["row"]: e["effect"] for e in result.training_rows or []}
    out = []
    for r in rows:
        name = retrain_row(ledger, run, upto, r, seen[r][0], into, trust_code=trust_code)
        curve, _ = attribute_walk.walk(ledger, name, upto, {n: t.clone() for n, t in base.items()}, score,
                                       checkpoints={upto}, frozen=frozen)
        effect = final - probes.mean(curve[upto].rows)
        parent = ledger.get_run(name).parent
        out.append({"row": r, "run": name, "from": f"{parent[0]}@{parent[1]}", "without": final - effect,
                    "effect": effect, "replay_effect": replayed[r], "fingerprint": curve[upto].fingerprint,
                    "agree": _sign(effect) == _sign(replayed[r])})
    return out


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def rank_correlation(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's ρ (average ranks for ties); None for fewer than 2 points or a constant side."""
    if len(xs) != len(ys) or len(xs) < 2:
        return None
    rx, ry = mean_ranks(xs), mean_ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if vx == 0 or vy == 0 else cov / (vx * vy) ** 0.5
