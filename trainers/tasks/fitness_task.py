"""Tasks that score a whole `torch.nn.Module` (module runs), and `fitness:` itself.

A module run's task has no prompts: the engine's module backend builds each member's
weights into a copy of the module and calls `score(models, rows)`, which returns one finite
float per model. `rows` are the generation's seeds (`train_batch`): every member of a
generation sees the same ones (common random numbers), and they derive from the run's key
and the generation only, so a resume or another process gets the same rewards.

`fitness:pkg.mod:function` (or `fitness:/abs/file.py:function`) names the user's function,
imported as a reward function is and trusted as one (a stored one needs --trust-code):
`function(model) -> float`, or with `batched: true` `function(models) -> sequence of
floats` (one per model, in order). A function with a parameter named `seed` gets the
generation's seed (an int) too. A NaN, an infinity, a non-number, a wrong length or an
exception is one line naming the function and the member.

`in-process:NAME` names an object handed to `seedledger.evolve` in this process (`in_process`).
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.noise import member_key, run_key
from seedledger.trainers.rewards.loader import load_reward_fn

IN_PROCESS = "in-process:"
SEED_OFFSET = 2_000_000  # member_key(run_key, generation, SEED_OFFSET + i): episode i's seed
# held-out row i's seed: member_key(run_key(HELD_OUT_SEED), 0, HELD_OUT_OFFSET + i). Generation 0
# is never trained, so no training episode has it, and it is the same whatever the run seed,
# so two runs of one task are scored on the same rows.
HELD_OUT_SEED, HELD_OUT_OFFSET, HELD_OUT_ROWS = 0, 3_000_000, 100_000
_BOUND: dict[str, Any] = {}


@contextlib.contextmanager
def in_process(objects: Mapping[str, Any]) -> Iterator[None]:
    """While the block runs, `in-process:NAME` refs (the keys) resolve to these objects."""
    saved = dict(_BOUND)
    _BOUND.update(objects)
    try:
        yield
    finally:
        _BOUND.clear()
        _BOUND.update(saved)


def load_object(ref: str, what: str) -> Any:
    """What `ref` names: an object bound in process, else `module:function` /
    `file.py:function` imported (SeedLedgerError naming `what` when it cannot be)."""
    if ref.startswith(IN_PROCESS):
        if ref not in _BOUND:
            raise SeedLedgerError(
                f"{what} {ref!r} was handed to seedledger.evolve in another process: pass it to "
                "seedledger.evolve again to continue this run"
            )
        return _BOUND[ref]
    try:
        return load_reward_fn(ref)
    except SeedLedgerError as exc:
        raise SeedLedgerError(str(exc).replace("reward function", what, 1)) from None


class ModelTask:
    """The surface the loop and the module backend use (a module run's `Task`)."""

    name = "model"
    scores_models = True  # the evaluator hands it modules, not completions
    levels = 1
    level = 0
    decodes = False
    likelihood_rewards: list = []
    rewards: list = []
    held_out_size = HELD_OUT_ROWS  # held-out rows (`evaluate`, `evaluation.every`, tune): seeds
    held_out_unit = "seeds"  # what a held-out row is, as `evaluate`'s report names it
    batched = False  # True: `score` takes all the members' modules at once (one batched fitness)

    def __init__(self, episodes: int = 1):
        if isinstance(episodes, bool) or not isinstance(episodes, int) or not 1 <= episodes <= 4096:
            raise SeedLedgerError(f"task {self.name}: episodes must be an integer in [1, 4096], not {episodes!r}")
        self.episodes = episodes

    def train_batch(self, seed: int, generation: int, size: int) -> tuple[list[int], list[int]]:
        """(episode indices, episode seeds) of `generation`: pure in the run seed and it."""
        key = run_key(seed)
        return list(range(self.episodes)), [member_key(key, generation, SEED_OFFSET + i) for i in range(self.episodes)]

    def held_out_seeds(self, skip: int, count: int) -> list[int]:
        """Held-out rows `skip`..`skip + count - 1` (`evaluate`): seeds no training generation uses."""
        if skip + count > HELD_OUT_ROWS:
            raise SeedLedgerError(f"{self.label}: held-out rows stop at {HELD_OUT_ROWS - 1}")
        key = run_key(HELD_OUT_SEED)
        return [member_key(key, 0, HELD_OUT_OFFSET + i) for i in range(skip, skip + count)]

    def held_out(self, model: Any, seeds: list[int]) -> list[float]:
        """`model`'s reward on each held-out row alone (its seed as the generation's one)."""
        return [self.score([model], [seed], [0])[0] for seed in seeds]

    def test_rows(self) -> list:
        raise SeedLedgerError(f"{self.label} scores a torch.nn.Module, with no held-out text rows: its held-out "
                              "rows are seeds (held_out_seeds)")

    def set_level(self, level: int) -> None:
        """Module tasks have one level (a curriculum is refused by the config)."""

    def objectives(self) -> dict[str, float]:
        return {}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "episodes": self.episodes}

    def score(self, models: Sequence[Any], rows: list[int], members: Sequence[int]) -> list[float]:
        """One finite reward per model (`members`: their indices, for messages)."""
        raise NotImplementedError

    def checked(self, value: Any, member: int) -> float:
        """`value` as a finite float, else one line naming the task and the member."""
        if isinstance(value, bool) or not isinstance(value, int | float) and not hasattr(value, "__float__"):
            raise SeedLedgerError(f"{self.label}: returned {type(value).__name__} for member {member}, not a number")
        try:
            number = float(value)
        except (TypeError, ValueError, RuntimeError) as exc:  # a tensor of more than one element
            why = f"{self.label}: returned a value for member {member} that is not one number ({exc})"
            raise SeedLedgerError(why.splitlines()[0]) from None
        if not math.isfinite(number):
            raise SeedLedgerError(f"{self.label}: returned {number} for member {member}; a fitness must be finite")
        return number

    @property
    def label(self) -> str:
        return f"task {self.name}"


class FitnessTask(ModelTask):
    """`fitness:REF`: the user's function scores each member's module (module docstring)."""

    name = "fitness"

    def __init__(self, ref: str, batched: bool = False):
        super().__init__(1)
        self.ref = ref
        self.fn = load_object(ref, "fitness")
        if not callable(self.fn):
            raise SeedLedgerError(f"fitness {ref!r}: not callable")
        self.batched = bool(batched)
        self.takes_seed = _takes_seed(self.fn)

    @property
    def label(self) -> str:
        return f"fitness {self.ref!r}"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "fn": self.ref, "batched": self.batched}

    def score(self, models: Sequence[Any], rows: list[int], members: Sequence[int]) -> list[float]:
        extra = {"seed": rows[0]} if self.takes_seed else {}
        if not self.batched:
            return [self.checked(self._call(m, extra, f"member {i}"), i) for m, i in zip(models, members, strict=True)]
        values = self._call(list(models), extra, f"members {members[0]}..{members[-1]}")
        try:
            values = list(values)
        except TypeError:
            raise SeedLedgerError(f"{self.label}: batched, so it must return a sequence of numbers, "
                                  f"not {type(values).__name__}") from None
        if len(values) != len(models):
            raise SeedLedgerError(f"{self.label}: returned {len(values)} values for {len(models)} models "
                                  "(batched: one per model, in order)")
        return [self.checked(v, i) for v, i in zip(values, members, strict=True)]

    def _call(self, arg: Any, extra: dict[str, int], whom: str) -> Any:
        try:
            return self.fn(arg, **extra)
        except SeedLedgerError:
            raise
        except Exception as exc:
            why = f"{self.label}: raised {type(exc).__name__} for {whom}: {exc}"
            raise SeedLedgerError(why.splitlines()[0]) from exc


def _takes_seed(fn: Any) -> bool:
    try:
        return "seed" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def load(path: str = "", batched: bool = False, seed: int = 0, rewards: Any = None, **unused: Any) -> FitnessTask:
    """`fitness:REF` (REF: `pkg.mod:function`, `/abs/file.py:function` or `in-process:NAME`)."""
    if not path:
        raise SeedLedgerError("task fitness: name the function, fitness:pkg.mod:function")
    if rewards is not None:
        raise SeedLedgerError("task fitness: the function is the reward; `rewards` does not apply")
    return FitnessTask(path, batched)


def fitness_refs(spec: Any) -> list[str]:
    """The code a `fitness:` task spec (string or mapping, already expanded) would import."""
    ref = spec.partition(":")[2] if isinstance(spec, str) else spec.get("path") if isinstance(spec, dict) else None
    return [ref] if isinstance(ref, str) and ref and not ref.startswith(IN_PROCESS) else []
