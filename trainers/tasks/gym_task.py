"""`gym:ENV_ID`: a gymnasium environment's mean episode return as the fitness.

Each member's module is the policy: it gets the observation as a float32 tensor (its
parameters' dtype) and returns one output per action (a `Discrete` space: the argmax is
taken) or the action itself (a `Box` space: clipped to its bounds). A member plays
`episodes` episodes (`gym:CartPole-v1?episodes=4`), each reset with the generation's
episode seed (ModelTask.train_batch), so every member of a generation meets the same
starts and a resume replays the same rewards. `max_steps` cuts an episode short (the
environment's own time limit applies too). Classic-control environments need only
gymnasium (the `gym` extra), no compiled simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.extras import require

from .fitness_task import ModelTask

MAX_STEPS = 1_000_000


def gymnasium():
    """gymnasium, imported now (one line naming the extra when it is missing)."""
    return require("gymnasium", "task gym")


class GymTask(ModelTask):
    name = "gym"

    def __init__(self, env_id: str, episodes: int = 1, max_steps: int | None = None):
        super().__init__(episodes)
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int)
                                      or not 1 <= max_steps <= MAX_STEPS):
            raise SeedLedgerError(f"task gym: max_steps must be an integer in [1, {MAX_STEPS}], not {max_steps!r}")
        gym = gymnasium()
        try:
            self.env = gym.make(env_id)
        except Exception as exc:  # gymnasium's NameNotFound, DependencyNotInstalled, ...
            raise SeedLedgerError(f"task gym: cannot make {env_id!r}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
        self.env_id = env_id
        self.max_steps = max_steps
        self.discrete = isinstance(self.env.action_space, gym.spaces.Discrete)

    @property
    def label(self) -> str:
        return f"task gym:{self.env_id}"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "env": self.env_id, "episodes": self.episodes, "max_steps": self.max_steps}

    def score(self, models: Sequence[Any], rows: list[int], members: Sequence[int]) -> list[float]:
        return [self.checked(sum(self.episode(m, s) for s in rows) / len(rows), i)
                for m, i in zip(models, members, strict=True)]

    def episode(self, model: Any, seed: int) -> float:
        """One episode's return with `model` acting greedily, reset with `seed`."""
        import numpy as np
        import torch

        first = next(model.parameters())
        plain = first.dtype == torch.float32 and first.device.type == "cpu"  # no cast or copy per step
        space = self.env.action_space
        obs, _ = self.env.reset(seed=seed)
        total, steps, done = 0.0, 0, False
        with torch.no_grad():
            while not done and (self.max_steps is None or steps < self.max_steps):
                x = torch.from_numpy(np.asarray(obs, dtype=np.float32))
                out = model(x) if plain else model(x.to(first.device, first.dtype)).float().cpu()
                if self.discrete:
                    action = int(out.argmax())
                else:
                    action = np.clip(out.numpy().reshape(space.shape), space.low, space.high).astype(space.dtype)
                obs, reward, terminated, truncated, _ = self.env.step(action)
                total += float(reward)
                steps += 1
                done = terminated or truncated
        return total


def load(path: str = "", episodes: int = 1, max_steps: int | None = None, seed: int = 0, rewards: Any = None,
         **unused: Any) -> GymTask:
    """`gym:ENV_ID` (e.g. `gym:CartPole-v1?episodes=4`)."""
    if not path:
        raise SeedLedgerError("task gym: name the environment, gym:CartPole-v1")
    if rewards is not None:
        raise SeedLedgerError("task gym: the episode return is the reward; `rewards` does not apply")
    return GymTask(path, episodes, max_steps)
