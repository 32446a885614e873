"""`evaluate` of a module run (any `torch.nn.Module`): held-out episodes, not text rows.

RUN@G and what it is compared against (`base`: generation 0 of its lineage, or another
RUN@G of the same model and task) are rebuilt from the ledger (the base is the run's
generation-0 anchor: data only), loaded into the module the stored factory makes, and
scored by the stored task on the same held-out rows: episode seeds that no training
generation uses (`ModelTask.held_out_seeds`), one reward per row (`ModelTask.held_out`),
so the paired change and its standard error mean what they mean for a language-model run
(engine.runtime.evaluation, whose `compare` and `evaluation` event this reuses).

Scoring runs code the stored config names: the factory's `forward` always, and a
`fitness:` function; so, as for `resume`, it needs --trust-code (a `gym:` task itself is
gymnasium's, not the ledger's).
"""

from __future__ import annotations

from collections.abc import Callable

from seedledger.engine.config import TrainConfig, validate
from seedledger.engine.refs import resolve_ref
from seedledger.engine.runtime.evaluation import EvaluationResult, compare
from seedledger.engine.runtime.evaluator import HeldOutScores
from seedledger.ledger import Ledger, RunInfo
from seedledger.ledger.errors import SeedLedgerError

__all__ = ["evaluate_module"]


def evaluate_module(
    ledger: Ledger, ref: str, rows: int | None = None, skip: int = 0, against: str | None = "base",
    *, trust_code: bool = False, record: bool = True, say: Callable[[str], None] | None = None,
) -> EvaluationResult:
    """`engine.runtime.evaluation.evaluate` for a module run (the module docstring)."""
    import torch

    from seedledger.engine.runtime.stored_code import check_stored_code, stored_code
    from seedledger.trainers.tasks.registry import load_task

    say = say or (lambda line: None)
    info, g = resolve_ref(ledger, ref)
    check_stored_code(stored_code(info.config), f"run {info.name}", trust_code)
    cfg = validate(info.config, f"run {info.name} config")
    other, og = _against(ledger, info, cfg, against, trust_code)
    if skip < 0 or (rows is not None and rows < 1):
        raise SeedLedgerError("evaluate: --rows must be at least 1 and --skip at least 0")
    count = rows if rows is not None else cfg.evaluation.rows
    task = load_task(cfg.task, seed=cfg.seed)
    seeds = task.held_out_seeds(skip, count)
    scored = {}
    for (name, gen), run in {(info.name, g): info, (other.name, og): other}.items():
        say(f"scoring {name}@{gen} on held-out rows {skip}..{skip + count - 1}…")
        with torch.no_grad():  # a fitness reads the model, as in training
            rewards = task.held_out(_module_at(ledger, run, gen, cfg), seeds)
        scored[name, gen] = HeldOutScores([f"seed {s}" for s in seeds], [""] * count, list(rewards), {})
    result = compare(info.name, g, f"{other.name}@{og}", skip, scored[other.name, og], scored[info.name, g],
                     samples=0)
    if record:
        try:
            ledger.log_event(info.name, "evaluation", result.payload("evaluate"))
        except SeedLedgerError as exc:  # a read-only ledger: the figures still stand
            result.event_error = str(exc)
    return result


def _against(ledger: Ledger, info: RunInfo, cfg: TrainConfig, against: str | None,
             trust_code: bool) -> tuple[RunInfo, int]:
    """`base` (or None): generation 0 of RUN's lineage; another RUN@G must be a module run of
    the same model and task (the same episodes, scored alike)."""
    if against in (None, "base"):
        return info, 0
    from seedledger.engine.runtime.stored_code import check_stored_code, stored_code

    other, g = resolve_ref(ledger, against)
    if other.name != info.name:
        check_stored_code(stored_code(other.config), f"run {other.name}", trust_code)
    theirs = validate(other.config, f"run {other.name} config")
    if other.base_model != info.base_model or theirs.task != cfg.task:
        raise SeedLedgerError(f"--against {against}: {other.name} is not the same model and task as {info.name}; "
                              "compare runs of one model and task")
    return other, g


def _module_at(ledger: Ledger, info: RunInfo, generation: int, cfg: TrainConfig):
    """The stored factory's module holding `info@generation`'s weights (rebuilt and checked)."""
    from seedledger.engine.rebuild.rebuilding import ref_master
    from seedledger.engine.runtime.backends.module import ModuleBackend

    _, master, _, _ = ref_master(ledger, f"{info.name}@{generation}")
    backend = ModuleBackend(cfg.model)
    backend.load_master(master)
    return backend.module
