"""Held-out rows scored, one way: the objective of `tune`, the fitness of `pbt`, and the
evaluation of a run (`seedledger evaluate`, `sl.evaluate`, the demo's report and
`evaluation.every` during training).

A `HeldOut` keeps its own replica, rebuilt from the ledger (the source of truth), not the
training pool's weights: the trained run stays an ordinary run and the score is a function
of the ledger alone, so a resumed tuner scores exactly what an uninterrupted one did.
Scoring the next generation of the same run replays only the new records (each checked
against its recorded fingerprint); anything else is a rebuild from a kept copy of the base
(anchors used when present).
Decoding is greedy (`Evaluator.held_out_rewards`); rows are `rows` test rows after `skip`
(a module run's: its task's held-out seeds, `Evaluator.held_out_scores`); `rows` None: the
task's test rows, at most `DEFAULT_EVALUATION_ROWS` (`preflight.held_out_rows`, checked
before the model loads).

RUN@G and what it is compared against (`base`: generation 0 of its lineage, or another
RUN@G of the same model and task) answer the same test rows greedily through one
`HeldOut` replica, so the paired change cancels the rows' difficulty. A module run's rows
are its task's held-out seeds (episodes no training generation plays), scored the same way
with no decoding; its stored factory and fitness run only with `trust_code`, as any stored
code does. Each evaluation is recorded as an `evaluation` event of RUN; nothing here
touches the training update, so fingerprints never depend on it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from seedledger.engine.config import TrainConfig, validate
from seedledger.engine.refs import resolve_ref
from seedledger.engine.runtime.dirs import anchors_dir
from seedledger.engine.runtime.hooks import Hooks
from seedledger.engine.runtime.models.resolve import resolve_model
from seedledger.engine.runtime.scoring.evaluator import Evaluator, HeldOutScores
from seedledger.engine.runtime.setup.preflight import held_out_rows
from seedledger.ledger import GenerationRecord, Ledger, RunInfo
from seedledger.ledger.errors import SeedLedgerError, VerifyMismatch
from seedledger.replay import update
from seedledger.trainers.fitness import mean
from seedledger.trainers.tasks import load_task

SAMPLES = 3  # before/after examples kept in a result (rows that changed first)


class HeldOut:
    def __init__(self, cfg: TrainConfig, rows: int | None, skip: int = 0, owner: str = "objective"):
        task = load_task(cfg.task, seed=cfg.seed)
        self.rows, self.skip = held_out_rows(task, rows, skip, owner), skip  # before the model loads
        self.evaluator = Evaluator(cfg, resolve_model(cfg.model), task=task)
        # what a row is, and whether greedy decoding answers it (a module run's: a seed, no)
        self.unit: str = task.held_out_unit
        self.greedy = not task.scores_models
        self._base = {k: v.clone() for k, v in self.evaluator.master.items()}
        self._at: tuple[str, int] | None = None  # the (run, generation) the replica holds

    def score(self, ledger: Ledger, run: str, generation: int) -> float:
        """Mean held-out reward of `run@generation` (unscorable rows count 0)."""
        return mean(self.rewards(ledger, run, generation)) or 0.0

    def rewards(self, ledger: Ledger, run: str, generation: int) -> list[float]:
        """Per-row held-out rewards of `run@generation` (for paired comparisons)."""
        return [0.0 if r is None else r for r in self.scores(ledger, run, generation).rewards]

    def scores(self, ledger: Ledger, run: str, generation: int) -> HeldOutScores:
        """Row by row: `run@generation`'s greedy answers, rewards (None: unscorable) and components."""
        self._move(ledger, run, generation)
        return self.evaluator.held_out_scores(self.rows, self.skip)

    def _move(self, ledger: Ledger, run: str, generation: int) -> None:
        if self._at is not None and self._at[0] == run and self._at[1] <= generation:
            steps = ledger.replay_history(run, upto=generation)[self._at[1] :]
            expected = ledger.fingerprints(run, upto=generation)
            for step in steps:
                fp = self.evaluator.apply(step)
                if fp != expected.get(step.index):
                    raise VerifyMismatch(f"{run}@{step.index} does not replay to its fingerprint", step.index)
        else:
            if self._at is not None:  # restore replays onto the base: start from a copy of it
                self.evaluator.master = {k: v.clone() for k, v in self._base.items()}
                self.evaluator.state = update.OptimizerState()
            self.evaluator.restore(ledger, run, generation, anchors_dir(ledger))
        self._at = (run, generation)


def paired_change(base: list[float | None], final: list[float | None]) -> dict[str, float]:
    """Mean per-row change from base to final on the same rows, its standard error, and how
    many rows got better or worse: the same problems for both models, so the row-to-row
    difficulty cancels and the error bar is the one that matters."""
    diffs = [f - b for b, f in zip(base, final, strict=True) if b is not None and f is not None]
    if not diffs:
        return {"mean": 0.0, "stderr": 0.0, "better": 0, "worse": 0}
    mean = statistics.fmean(diffs)
    stderr = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return {"mean": mean, "stderr": stderr,
            "better": sum(d > 0 for d in diffs), "worse": sum(d < 0 for d in diffs)}


def mean_reward(rewards: list[float | None]) -> float:
    """Mean over the rows that could be scored (0.0 when none could)."""
    kept = [r for r in rewards if r is not None]
    return statistics.fmean(kept) if kept else 0.0


@dataclass
class EvaluationResult:
    """RUN@G against another model on the same held-out rows (unscorable rows: None,
    left out of the means)."""

    run: str
    generation: int
    against: str  # RUN@G of the comparison (`base`: RUN's lineage at 0)
    rows: int
    skip: int
    mean: float
    against_mean: float
    components: dict[str, float | None]
    against_components: dict[str, float | None]
    change: dict[str, float]  # paired_change(against, this)
    rewards: list[float | None]
    against_rewards: list[float | None]
    completions: list[str]  # row by row, greedy
    against_completions: list[str]
    samples: list[dict[str, Any]]  # row, question, both completions and rewards
    event_error: str | None = None  # why the `evaluation` event was not recorded (a read-only ledger)
    unit: str = "rows"  # what a row is (a module run's: its task's held-out seeds)
    greedy: bool = True  # rows answered by greedy decoding (a module run's: no decoding)

    def payload(self, by: str) -> dict[str, Any]:
        """The `evaluation` event: the figures, not the rows (`by`: who scored)."""
        keep = ("generation", "rows", "skip", "mean", "components", "against", "against_mean",
                "against_components", "change")
        return {k: getattr(self, k) for k in keep} | {"greedy": self.greedy, "by": by}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(run: str, generation: int, against: str, skip: int,
            before: HeldOutScores, after: HeldOutScores, samples: int = SAMPLES) -> EvaluationResult:
    """The figures of `after` (RUN@G) against `before` on the same rows (`samples` of
    them shown; none when nothing was decoded: a module run's rows have no answers)."""
    return EvaluationResult(
        run=run, generation=generation, against=against, rows=len(after.rewards), skip=skip,
        mean=mean_reward(after.rewards), against_mean=mean_reward(before.rewards),
        components=after.component_means(), against_components=before.component_means(),
        change=paired_change(before.rewards, after.rewards),
        rewards=after.rewards, against_rewards=before.rewards,
        completions=after.completions, against_completions=before.completions,
        samples=_examples(before, after, skip, samples if after.greedy else 0),
        unit=after.unit, greedy=after.greedy,
    )


def _examples(before: HeldOutScores, after: HeldOutScores, skip: int, limit: int) -> list[dict[str, Any]]:
    """Up to `limit` rows, those whose reward changed most first, then those whose answer
    changed; the first rows when nothing changed."""
    def moved(i: int) -> float:
        b, a = before.rewards[i], after.rewards[i]
        return abs((a or 0.0) - (b or 0.0)) + (before.completions[i] != after.completions[i]) * 1e-9

    order = sorted(range(len(after.rewards)), key=lambda i: (-moved(i), i))
    changed = [i for i in order if moved(i) > 0] or order
    return [
        {"row": skip + i, "question": after.questions[i],
         "against_completion": before.completions[i], "completion": after.completions[i],
         "against_reward": before.rewards[i], "reward": after.rewards[i]}
        for i in changed[:limit]
    ]


def _comparison(ledger: Ledger, info: RunInfo, cfg: TrainConfig, against: str | None,
                trust_code: bool) -> tuple[RunInfo, int]:
    """The model `against` names: `base` (or None) is generation 0 of RUN's lineage; another
    RUN@G must share RUN's model, trained parameters and task (the same rows, scored alike)."""
    if against in (None, "base"):
        return info, 0
    from seedledger.engine.runtime.setup.stored_code import check_stored_code, stored_code

    other, g = resolve_ref(ledger, against)
    if other.name != info.name:
        check_stored_code(stored_code(other.config), f"run {other.name}", trust_code)
    theirs = validate(other.config, f"run {other.name} config")
    if other.base_model != info.base_model or not theirs.same_master(cfg) or theirs.task != cfg.task:
        raise SeedLedgerError(
            f"--against {against}: {other.name} is not the same model, trained parameters and task as "
            f"{info.name}; compare runs of one base model and task"
        )
    return other, g


def evaluate(
    ledger: Ledger, ref: str, rows: int | None = None, skip: int = 0, against: str | None = "base",
    *, trust_code: bool = False, record: bool = True, say: Callable[[str], None] | None = None,
) -> EvaluationResult:
    """Score RUN@G (RUN: its latest) and `against` on `rows` test rows after `skip`
    (default: the config's `evaluation.rows`, else the task's test rows up to 64) and,
    with `record`, log it as an `evaluation` event of RUN. Reward code the stored configs name is imported only with
    `trust_code` (as `resume`), checked before any task is built."""
    from seedledger.engine.runtime.setup.stored_code import check_stored_code, stored_code

    say = say or (lambda line: None)
    info, g = resolve_ref(ledger, ref)
    check_stored_code(stored_code(info.config), f"run {info.name}", trust_code)
    cfg = validate(info.config, f"run {info.name} config")
    other, og = _comparison(ledger, info, cfg, against, trust_code)
    if skip < 0 or (rows is not None and rows < 1):
        raise SeedLedgerError("evaluate: --rows must be at least 1 and --skip at least 0")
    scorer = HeldOut(cfg, rows if rows is not None else cfg.evaluation.rows, skip, owner="evaluate")
    scored = {}
    for name, gen in sorted({(other.name, og), (info.name, g)}, key=lambda p: (p[0] != info.name, p[1])):
        say(f"scoring {name}@{gen} on {_rows(scorer, skip, scorer.rows)}…")
        scored[name, gen] = scorer.scores(ledger, name, gen)
    result = compare(info.name, g, f"{other.name}@{og}", skip, scored[other.name, og], scored[info.name, g])
    if record:
        try:
            ledger.log_event(info.name, "evaluation", result.payload("evaluate"))
        except SeedLedgerError as exc:  # a read-only ledger: the figures still stand
            result.event_error = str(exc)
    return result


def _rows(scorer: HeldOut, skip: int, count: int) -> str:
    """The rows `scorer` scores, as progress names them."""
    last = skip + count - 1
    return f"rows {skip}..{last} (greedy)" if scorer.greedy else f"held-out {scorer.unit} {skip}..{last}"


class DuringTraining:
    """`evaluation.every: K`: after every K-th generation a session commits, and after its
    last, score the held-out rows against the base and record an `evaluation` event. It
    rides on `Hooks.on_generation_end` with its own replica, so the update never sees it."""

    def __init__(self, ledger: Ledger, run: str, cfg: TrainConfig, heartbeat: Callable[[], None]):
        self.ledger, self.run, self.cfg, self.heartbeat = ledger, run, cfg, heartbeat
        self.scorer: HeldOut
        self.base: HeldOutScores
        self.done: set[int] = set()
        self.notice: Callable[[str, str], None] = lambda level, message: None

    def start(self, inner: Hooks) -> Hooks:
        """Load the replica and score the base before training (a config whose rows the task
        cannot serve fails before any generation); returns `inner` with the scoring hook."""
        self.scorer = HeldOut(self.cfg, self.cfg.evaluation.rows, owner="evaluation.every")
        self.base = self.scorer.scores(self.ledger, self.run, 0)
        self.heartbeat()

        def end(record: GenerationRecord, seconds: float) -> None:
            inner.on_generation_end(record, seconds)
            if record.index % self.cfg.evaluation.every == 0:
                self.at(record.index)

        self.notice = inner.on_notice
        return replace(inner, on_generation_end=end)

    def finish(self, latest: int) -> None:
        """The session's last generation, unless it was just scored (or nothing trained)."""
        if latest > 0 and latest not in self.done:
            self.at(latest)

    def at(self, generation: int) -> None:
        self.heartbeat()
        result = compare(self.run, generation, f"{self.run}@0", 0, self.base,
                         self.scorer.scores(self.ledger, self.run, generation))
        self.ledger.log_event(self.run, "evaluation", result.payload("training"))
        self.done.add(generation)
        self.heartbeat()
        c = result.change
        self.notice("note", f"held-out @{generation}: {result.mean:.4f} ({result.rows} rows; "
                            f"{c['mean']:+.4f} ± {c['stderr']:.4f} against the base)")
