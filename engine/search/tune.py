"""`seedledger tune`: an Optuna study whose trials are ordinary runs of the ledger.

The study file (YAML):

    config: quickstart.yaml          # the training config every trial starts from (relative to this file)
    study: lr-sigma                  # default: the file's stem; trial n is run `<study>-t<nnn>`
    trials: 6                        # the study's total (`--trials` overrides)
    set: [generations=4]             # fixed overrides for every trial
    budget: 2048                     # optional: generations = budget // (population × batch_size)
    objective: {rows: 64, skip: 0, every: 2}   # held-out reward of test rows skip..skip+rows-1,
                                     # reported every `every` generations (0: only at the end)
    sampler: {name: tpe, seed: 0, startup_trials: 10}    # or random
    pruner: {name: median, startup_trials: 2, warmup: 0} # or none; needs objective.every > 0
    space:                           # any config key `--set` takes
      lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
      population: {type: categorical, choices: [4, 8]}
      optimizer.name: {type: categorical, choices: [sgd, adam]}

Storage. The study lives in the ledger's own database, beside the ledger's tables, and one
tuner at a time holds it (`engine.search.studystore`: Optuna's schema checked, the study's lease).

Each trial is an ordinary run: created (`session.start`, no generations), given a
`tune-trial` event (study, trial number, parameters), then trained by `session.resume` with
a hook that scores `RUN@G` every `objective.every` generations (`engine.runtime.scoring.heldout`), reports
it and stops the session when the pruner says so; the final held-out reward is the trial's
value, and a `tune-result` event records the outcome. Determinism: every trial keeps the
config's seed (the same batches and noise keys: trials differ by their parameters only),
and the sampler is re-seeded per trial from (seed, trial number), so the parameters of trial
n depend only on the seed and trials 0..n-1, whether or not the tuner was killed between.
Resume: rerunning the same command first finishes trials left RUNNING by a dead tuner
(their runs resume from their last committed generation; a run whose writer lease is live
belongs to another tuner and is skipped), then asks new ones until the study holds
`trials`. Nothing is lost and nothing trains twice. A trial run's stored config and the
parameters in Optuna's tables are data (a copied ledger may plant them): `engine.search.tunecheck`
holds them to the study file before anything is built from them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from seedledger.engine.config import load_config, validate
from seedledger.engine.runtime import session
from seedledger.engine.runtime.hooks import Hooks
from seedledger.engine.runtime.setup.inputs import reading
from seedledger.engine.search import studystore, tunecheck
from seedledger.engine.search.studystore import open_study
from seedledger.ledger import Ledger
from seedledger.ledger.errors import LeaseHeld, SeedLedgerError
from seedledger.ledger.extras import require
from seedledger.replay.hashing import splitmix64


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Objective(_Strict):
    rows: int = Field(64, ge=1, description="held-out test rows scored")
    skip: int = Field(0, ge=0, description="test rows skipped first (keep a report's rows unseen)")
    every: int = Field(0, ge=0, description="intermediate evaluation every K generations (0: end only)")


class SamplerSpec(_Strict):
    name: Literal["tpe", "random"] = "tpe"
    seed: int = Field(0, ge=0, lt=2**63)
    startup_trials: int = Field(10, ge=0, description="TPE: random trials before modelling")


class PrunerSpec(_Strict):
    name: Literal["median", "none"] = "median"
    startup_trials: int = Field(2, ge=0, description="trials finished before any is pruned")
    warmup: int = Field(0, ge=0, description="generations before a trial can be pruned")


class Param(_Strict):
    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: list[bool | int | float | str] | None = None

    @model_validator(mode="after")
    def _complete(self) -> Param:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("categorical needs choices")
        elif self.low is None or self.high is None or not self.low <= self.high:
            raise ValueError(f"{self.type} needs low <= high")
        return self

    def samples(self) -> list[Any]:
        """Values that bound the range (checked against the config before the study starts)."""
        if self.type == "categorical":
            return list(self.choices or [])
        cast = int if self.type == "int" else float
        return [cast(self.low), cast(self.high)]

    def suggest(self, trial, name: str) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(name, self.choices)
        if self.type == "int":
            return trial.suggest_int(name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)


class StudySpec(_Strict):
    config: str
    study: str | None = None
    trials: int | None = Field(None, ge=1)
    set: list[str] = []
    budget: int | None = Field(
        None, ge=1, description="population × batch_size × generations per trial: when set, each "
        "trial's generations are derived from its population and batch size (a search within a budget)",
    )
    objective: Objective = Objective()
    sampler: SamplerSpec = SamplerSpec()
    pruner: PrunerSpec = PrunerSpec()
    space: dict[str, Param] = Field(min_length=1)


def load_study(path: str | Path) -> tuple[StudySpec, Path, str]:
    """(spec, absolute training-config path, study name); bad input -> SeedLedgerError."""
    spec = _load_yaml_model(path, StudySpec)
    config = (Path(path).resolve().parent / spec.config).resolve()
    return spec, config, spec.study or Path(path).stem


def _load_yaml_model(path: str | Path, model: type[BaseModel]):
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SeedLedgerError(f"{path}: no such file") from None
    except yaml.YAMLError:
        raise SeedLedgerError(f"{path}: not valid YAML") from None
    if not isinstance(data, dict):
        raise SeedLedgerError(f"{path}: expected a mapping")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        reason = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise SeedLedgerError(f"{path}: {where}: {reason}") from None


def override(key: str, value: Any) -> str:
    """`key=value` that `--set` parses back to exactly `value` (YAML wants a dot in floats)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if e and "." not in mantissa:
            text = f"{mantissa}.0e{exponent}"
    elif isinstance(value, str):
        text = json.dumps(value)
    else:
        text = str(value)
    return f"{key}={text}"


def check_space(config: Path, fixed: list[str], space: dict[str, Param]) -> None:
    """Every parameter names a config key, and its bounds and choices validate."""
    load_config(config, fixed)
    for name, param in space.items():
        for value in param.samples():
            try:
                load_config(config, [*fixed, override(name, value)])
            except SeedLedgerError as exc:
                raise SeedLedgerError(f"space.{name} = {value!r}: {exc}") from None


def _sampler(spec: SamplerSpec, number: int):
    """The sampler for trial `number`, seeded from (seed, number): a restarted tuner draws
    what an uninterrupted one would have."""
    optuna = require("optuna", studystore.FEATURE)

    seed = splitmix64((spec.seed * 1_000_003 + number) % 2**64) % 2**32
    if spec.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.startup_trials)


def trial_run(study: str, number: int) -> str:
    return f"{study}-t{number:03d}"


class _Reporter:
    """The trial's hook: score every `every` generations, report, stop when pruned."""

    def __init__(self, ledger: Ledger, run: str, trial, held_out, every: int):
        self.ledger, self.run, self.trial, self.held_out, self.every = ledger, run, trial, held_out, every
        self.pruned_at: int | None = None

    def reported(self) -> dict[int, float]:
        return dict(self.trial.study._storage.get_trial(self.trial._trial_id).intermediate_values)

    def at(self, generation: int) -> None:
        """Score and report `generation` if it is a reporting step not yet reported."""
        if not self.every or generation % self.every or generation in self.reported():
            return
        self.trial.report(self.held_out.score(self.ledger, self.run, generation), generation)

    def check(self, generation: int) -> bool:
        if self.every and self.reported() and self.trial.should_prune():
            self.pruned_at = generation
        return self.pruned_at is not None

    def hooks(self) -> Hooks:
        def end(record, seconds: float) -> None:
            self.at(record.index)
            self.check(record.index)

        return Hooks(on_generation_end=end, should_stop=lambda: self.pruned_at is not None)


def run_trial(
    ledger: Ledger, study, study_name: str, spec: StudySpec, config: Path, trial,
    trust_code: bool = False,
) -> dict[str, Any]:
    """Run (or finish) one trial; tells Optuna its outcome and returns a summary."""
    from seedledger.engine.runtime.scoring.heldout import HeldOut

    TrialState = require("optuna.trial", studystore.FEATURE).TrialState  # noqa: N806 - Optuna's enum

    number = trial.number
    name = trial_run(study_name, number)
    params = {key: param.suggest(trial, key) for key, param in spec.space.items()}
    tunecheck.check_params(name, spec.space, params)  # Optuna's tables may hold planted values
    overrides = [*spec.set, *(override(k, v) for k, v in params.items())]
    if spec.budget is not None:
        cfg = load_config(config, overrides)
        overrides.append(f"generations={max(1, spec.budget // (cfg.population * cfg.batch_size))}")
    if not ledger.has_run(name):
        session.start(ledger, str(config), name, overrides, 0)
    elif tunecheck.trial_event(ledger, name) is None and ledger.latest_generation(name) > 0:
        raise tunecheck.ForeignTrial(f"run {name!r} exists and is not trial {number} of study {study_name!r}")
    # before HeldOut builds a task from the stored config, or anything trains on it
    tunecheck.check_stored_trial(ledger, name, number, study_name, params,
                                 tunecheck.expected_config(config, overrides), trust_code,
                                 tunecheck.own_code(config, spec.set))
    if tunecheck.trial_event(ledger, name) is None:  # new, or a dead tuner made the run but not its event
        ledger.log_event(name, "tune-trial", {"study": study_name, "trial": number, "params": params})
    cfg = validate(ledger.get_run(name).config, f"run {name} config")
    held_out = HeldOut(cfg, spec.objective.rows, spec.objective.skip)
    reporter = _Reporter(ledger, name, trial, held_out, spec.objective.every)
    latest = ledger.latest_generation(name)
    if latest:  # a trial a dead tuner left: catch up on its report, then its pruning decision
        reporter.at(latest)
        reporter.check(latest)
    if reporter.pruned_at is None and latest < cfg.generations:
        session.resume(ledger, name, None, reporter.hooks(), trust_code=True)  # its code: checked above
    latest = ledger.latest_generation(name)
    if reporter.pruned_at is not None:
        outcome = {"state": "pruned", "value": reporter.reported().get(latest), "generation": latest}
    else:
        value = reporter.reported().get(latest)
        outcome = {"state": "complete", "generation": latest,
                   "value": held_out.score(ledger, name, latest) if value is None else value}
    if not ledger.events(name, kind="tune-result"):  # the event first: a kill before `tell`
        ledger.log_event(name, "tune-result", {"study": study_name, "trial": number, **outcome})
    if outcome["state"] == "pruned":  # leaves the trial RUNNING, and the rerun tells it again
        study.tell(number, state=TrialState.PRUNED)
    else:
        study.tell(number, outcome["value"])
    return {"trial": number, "run": name, "params": params, **outcome}


def tune(
    ledger: Ledger,
    study_path: str | Path,
    trials: int | None = None,
    study_name: str | None = None,
    overrides: list[str] = (),
    on_trial: Callable[[dict[str, Any]], None] = lambda summary: None,
    trust_code: bool = False,
) -> dict[str, Any]:
    """Bring the study to `trials` trials (finishing any a dead tuner left); its summary."""
    spec, config, default_name = load_study(study_path)
    spec = spec.model_copy(update={"set": [*spec.set, *overrides]})
    name = study_name or default_name
    total = trials or spec.trials
    if total is None:
        raise SeedLedgerError("tune: how many trials? (--trials N or `trials:` in the study file)")
    if spec.objective.every == 0 and spec.pruner.name != "none":
        spec = spec.model_copy(update={"pruner": PrunerSpec(name="none")})  # nothing to prune on
    check_space(config, spec.set, spec.space)
    study = open_study(ledger, name, spec.sampler, spec.pruner)
    # one tuner per study, before any trial; every trial's sessions record the study file's sha256
    with studystore.held(ledger, study._study_id, name), reading(study_path):
        return _bring(ledger, study, name, spec, config, total, on_trial, trust_code)


def _bring(ledger, study, name, spec, config, total, on_trial, trust_code: bool) -> dict[str, Any]:
    """The study's trials, under its lease: first those a dead tuner left RUNNING."""
    optuna = require("optuna", studystore.FEATURE)
    TrialState = optuna.trial.TrialState  # noqa: N806 - Optuna's enum

    own = tunecheck.own_code(config, spec.set)
    for trial in study.get_trials(deepcopy=False):  # before any trial is touched (or told FAIL)
        if trial.state == TrialState.RUNNING:  # to be finished with the parameters it holds
            tunecheck.check_params(trial_run(name, trial.number), spec.space, trial.params)
        if ledger.has_run(trial_run(name, trial.number)):
            tunecheck.check_code(ledger, trial_run(name, trial.number), trust_code, own)
    ran = []
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.sampler = _sampler(spec.sampler, frozen.number)  # for any parameter not yet drawn
        try:
            trial = optuna.trial.Trial(study, frozen._trial_id)
            ran.append(_guarded(ledger, study, name, spec, config, trial, trust_code))
        except LeaseHeld:
            continue  # another tuner is training it
        on_trial(ran[-1])
    while len(study.get_trials(deepcopy=False)) < total:
        study.sampler = _sampler(spec.sampler, len(study.get_trials(deepcopy=False)))
        ran.append(_guarded(ledger, study, name, spec, config, study.ask(), trust_code))
        on_trial(ran[-1])
    return summary(study, name, ran)


def _guarded(ledger, study, name, spec, config, trial, trust_code: bool = False) -> dict[str, Any]:
    """A trial that fails is told FAIL (and stays in the ledger); an interrupt leaves it
    RUNNING so that the next `tune` finishes it."""
    TrialState = require("optuna.trial", studystore.FEATURE).TrialState  # noqa: N806 - Optuna's enum

    try:
        return run_trial(ledger, study, name, spec, config, trial, trust_code)
    except (LeaseHeld, tunecheck.ForeignTrial):
        raise  # another tuner's trial, or a planted one: not this trial's outcome
    except Exception as exc:
        study.tell(trial.number, state=TrialState.FAIL)
        run = trial_run(name, trial.number)
        if ledger.has_run(run):
            ledger.log_event(run, "tune-result", {"study": name, "trial": trial.number, "state": "fail",
                                                  "error": f"{type(exc).__name__}: {exc}"})
        raise


def summary(study, name: str, ran: list[dict[str, Any]]) -> dict[str, Any]:
    trials = []
    for t in study.get_trials(deepcopy=False):
        value = t.value if t.value is not None else (
            t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None
        )
        trials.append({
            "trial": t.number, "run": trial_run(name, t.number), "state": t.state.name.lower(),
            "value": None if value is None or not math.isfinite(value) else value, "params": t.params,
        })
    done = [t for t in trials if t["state"] == "complete"]
    best = max(done, key=lambda t: (t["value"], -t["trial"])) if done else None
    return {"study": name, "trials": trials, "best": best, "ran_now": [r["trial"] for r in ran]}
