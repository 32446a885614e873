"""`seedledger.evolve`: evolve any `torch.nn.Module` against a fitness, in the ledger.

The same session `train`, `resume` and `fork` run (engine.runtime.session), on the module
backend (engine.runtime.backends.module): a config is built from the arguments, with
`model` and `task` naming the module and the fitness as code (`module:pkg.mod:factory`,
`fitness:pkg.mod:function`) when they are importable, else as `in-process:NAME`, bound to
the objects for the call (engine.runtime.models.module). So the ledger, replay, the
policies, optimizers, schedules, shaping, kill-and-resume, fork, verify, seed files and
rebuild are the language-model runs' own.

One call starts a run, or continues it when the ledger holds `run` already (the model and
fitness must be the ones it stored; its base fingerprint checks the model's weights), or
with `fork="RUN@G"` starts `run` from there with the settings given here changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seedledger.engine.api import LedgerArg, ledger_for_call, progress_hooks, with_final_run
from seedledger.ledger.errors import SeedLedgerError

if TYPE_CHECKING:
    from seedledger.engine.runtime.hooks import Hooks
    from seedledger.engine.runtime.session import SessionResult

__all__ = ["DEFAULTS", "evolve"]

# A new run's settings where the call gives none: neuroevolution's scale, not a language
# model's (TrainConfig's own defaults are for LLM fine-tuning).
DEFAULTS: dict[str, Any] = {"population": 16, "sigma": 0.05, "lr": 0.05, "generations": 50}


def evolve(
    model: Any,
    fitness: Any,
    *,
    population: int | None = None,
    sigma: float | None = None,
    lr: float | None = None,
    algorithm: str | None = None,
    generations: int | None = None,
    optimizer: str | Mapping[str, Any] | None = None,
    shaping: str | None = None,
    seed: int | None = None,
    batched: bool = False,
    config: Mapping[str, Any] | None = None,
    run: str | None = None,
    fork: str | None = None,
    ledger: LedgerArg = None,
    train: int | None = None,
    hooks: Hooks | None = None,
    progress: bool = False,
) -> SessionResult:
    """Evolve `model` (a `torch.nn.Module`, a zero-argument factory returning one, or a
    `module:pkg.mod:factory` string) against `fitness`: a function `fitness(model) ->
    float` (with `batched=True`, `fitness(models) -> sequence of floats`, one per model; a
    parameter named `seed` gets the generation's seed), or a task string (`gym:CartPole-v1`,
    `gym:Pendulum-v1?episodes=4`, `fitness:pkg.mod:function`). Higher is better.

    `population`, `sigma`, `lr`, `algorithm` (es, cmaes, ga, lmmaes), `generations` (the
    run's target), `optimizer`, `shaping`, `seed` and any other config key in `config` are
    the run's settings (`DEFAULTS` fill the first four for a new run). `run` names the run
    (default `evolve`); when the ledger holds it, the call continues it (to its target, or
    `train` more generations) and settings given here are refused. `fork="RUN@G"` starts
    `run` there with the given settings changed (e.g. another σ). `train` generations are
    trained in this session (default: up to the target). Returns the session's result
    (`run.status`, `fingerprint`, `records`); `seedledger.rebuild(run)` gives the weights."""
    from seedledger.engine.runtime import session
    from seedledger.engine.runtime.models.module import bound
    from seedledger.trainers.tasks.registry import absolute_paths

    model_ref, objects = _named(model, "model")
    task, more = _task(fitness, batched)
    objects |= more
    given = {k: v for k, v in (("population", population), ("sigma", sigma), ("lr", lr), ("algorithm", algorithm),
                               ("generations", generations), ("optimizer", optimizer), ("shaping", shaping),
                               ("seed", seed)) if v is not None} | dict(config or {})
    name = run or "evolve"
    with ledger_for_call(ledger, create=True) as led, bound(objects):
        hooks_ = progress_hooks(hooks, progress)
        if fork is not None:
            overrides = [f"{k}={_flow(v)}" for k, v in given.items()]
            parent, _, _ = fork.partition("@")
            trust = _same_code(led.get_run(parent).config, model_ref, task)
            return with_final_run(led, session.fork(led, fork, name, overrides, train, hooks_, trust_code=trust))
        if led.has_run(name):
            if given:
                raise SeedLedgerError(f"run {name!r} exists: evolve continues it with its stored settings "
                                      f"({', '.join(given)} given); fork it to change them (fork='{name}@G')")
            stored = led.get_run(name).config
            if stored.get("model") != model_ref or stored.get("task") != absolute_paths(task, Path.cwd()):
                raise SeedLedgerError(
                    f"run {name!r} evolved model {stored.get('model')!r} on {stored.get('task')!r}; this call "
                    f"passes {model_ref!r} on {task!r}: pass the same ones, or name another run")
            trust = _same_code(stored, model_ref, task)
            return with_final_run(led, session.resume(led, name, train, hooks_, trust_code=trust))
        cfg = DEFAULTS | given | {"model": model_ref, "task": task}
        return with_final_run(led, session.start(led, cfg, name, [], train, hooks_))


def _named(obj: Any, what: str) -> tuple[str, dict[str, Any]]:
    """(the config's reference to `obj`, the in-process objects to bind for it)."""
    from seedledger.engine.runtime.models.module import IN_PROCESS, MODULE, ref_of

    if isinstance(obj, str):
        if what == "model" and not obj.startswith(MODULE):
            raise SeedLedgerError(f"model {obj!r}: name a torch.nn.Module factory as module:pkg.mod:factory")
        return obj, {}
    if what == "model" and not callable(obj) and not _is_module(obj):
        raise SeedLedgerError(
            f"model: expected a torch.nn.Module or a function returning one, not {type(obj).__name__}"
        )
    ref = ref_of(obj, what) if not _is_module(obj) else f"{IN_PROCESS}{type(obj).__name__}"
    return ref, ({ref: obj} if ref.startswith(IN_PROCESS) else {})


def _is_module(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def _task(fitness: Any, batched: bool) -> tuple[Any, dict[str, Any]]:
    """The config's `task` for `fitness`, and the in-process objects it needs."""
    if isinstance(fitness, str | dict):
        if batched:
            raise SeedLedgerError("batched=True applies to a fitness function; for a task string add ?batched=true")
        return fitness, {}
    if not callable(fitness):
        raise SeedLedgerError(f"fitness: expected a function or a task string, not {type(fitness).__name__}")
    ref, objects = _named(fitness, "fitness")
    spec = f"fitness:{ref}"
    return (f"{spec}?batched=true" if batched else spec), objects


def _same_code(stored: Mapping[str, Any], model_ref: str, task: Any) -> bool:
    """Whether the code a stored config would run is what this call names itself (then the
    call is the user's trust, as `--trust-code` would be)."""
    from seedledger.engine.runtime.setup.stored_code import stored_code

    mine = set(stored_code({"model": model_ref, "task": task}))
    return set(stored_code(dict(stored))) <= mine


def _flow(value: Any) -> str:
    """A value as `--set` reads it (YAML flow: 0.1, es, {name: adam})."""
    import json

    return json.dumps(value) if isinstance(value, Mapping | Sequence) and not isinstance(value, str) else str(value)

