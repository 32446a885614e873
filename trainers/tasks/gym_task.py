"""`gym:ENV_ID`: a gymnasium environment's mean episode return as the fitness.

Each member's module is the policy: it gets the observation as a float32 tensor (its
parameters' dtype) and returns one output per action (a `Discrete` space: the argmax is
taken) or the action itself (a `Box` space: clipped to its bounds). A member plays
`episodes` episodes (`gym:CartPole-v1?episodes=4`), each reset with the generation's
episode seed (ModelTask.train_batch), so every member of a generation meets the same
starts and a resume replays the same rewards. `max_steps` cuts an episode short (the
environment's own time limit applies too). Classic-control environments need only
gymnasium (the `gym` extra), no compiled simulator.

`vectorized=true` plays all the members handed over at once (the whole population, or a
Ray worker's share), every member × episode in its own environment, stepped together: one
batched forward of the live rows per step (trainers.tasks.stacked_policy), finished
episodes dropped from the batch (no autoreset), each episode's return summed step by step
and a member's episodes in order, as the one-at-a-time path sums them. The environments
and seeds are the same; the batched forward can round differently from a single one, so
the mode is part of the task string the run stores, and a resume or fork plays it the same
way.
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
    held_out_unit = "episode seeds"  # one episode per held-out seed

    def __init__(self, env_id: str, episodes: int = 1, max_steps: int | None = None, vectorized: bool = False):
        super().__init__(episodes)
        if not isinstance(vectorized, bool):
            raise SeedLedgerError(f"task gym: vectorized must be true or false, not {vectorized!r}")
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int)
                                      or not 1 <= max_steps <= MAX_STEPS):
            raise SeedLedgerError(f"task gym: max_steps must be an integer in [1, {MAX_STEPS}], not {max_steps!r}")
        gym = gymnasium()
        try:
            self.env = gym.make(env_id)
        except Exception as exc:  # gymnasium's NameNotFound, DependencyNotInstalled, ...
            why = f"task gym: cannot make {env_id!r}: {type(exc).__name__}: {exc}"
            raise SeedLedgerError(why.splitlines()[0]) from None
        self.env_id = env_id
        self.max_steps = max_steps
        self.discrete = isinstance(self.env.action_space, gym.spaces.Discrete)
        self.vectorized = vectorized
        self.batched = vectorized  # the evaluator hands over all its members' modules at once
        self._envs = [self.env]  # one per member × episode, made once and reset per episode

    @property
    def label(self) -> str:
        return f"task gym:{self.env_id}"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "env": self.env_id, "episodes": self.episodes, "max_steps": self.max_steps,
                "vectorized": self.vectorized}

    def score(self, models: Sequence[Any], rows: list[int], members: Sequence[int]) -> list[float]:
        if self.vectorized:
            returns = self.episodes_together(models, rows)
            per_member = [returns[k * len(rows) : (k + 1) * len(rows)] for k in range(len(models))]
        else:
            per_member = [[self.episode(m, s) for s in rows] for m in models]
        return [self.checked(sum(mine) / len(rows), i) for mine, i in zip(per_member, members, strict=True)]

    def held_out(self, model: Any, seeds: list[int]) -> list[float]:
        """One episode's return per held-out seed (all in step when vectorized)."""
        returns = self.episodes_together([model], seeds) if self.vectorized else [self.episode(model, s) for s in seeds]
        return [self.checked(r, 0) for r in returns]

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

    def episodes_together(self, models: Sequence[Any], rows: list[int]) -> list[float]:
        """Every (member, episode)'s return, member-major, played in step: one batched
        forward of the episodes still running per step (the module docstring)."""
        import numpy as np
        import torch

        from .stacked_policy import StackedPolicy

        first = next(models[0].parameters())
        plain = first.dtype == torch.float32 and first.device.type == "cpu"
        policy = StackedPolicy(models, self.label)
        space = self.env.action_space
        owners = [k for k in range(len(models)) for _ in rows]
        envs = self._pool(len(owners))
        obs = [env.reset(seed=rows[i % len(rows)])[0] for i, env in enumerate(envs)]
        totals = [0.0] * len(owners)
        live, steps = list(range(len(owners))), 0
        while live and (self.max_steps is None or steps < self.max_steps):
            x = torch.from_numpy(np.stack([np.asarray(obs[i], dtype=np.float32) for i in live]))
            mine = [owners[i] for i in live]
            out = policy(x, mine) if plain else policy(x.to(first.device, first.dtype), mine).float().cpu()
            if self.discrete:
                actions = out.reshape(len(live), -1).argmax(dim=1).tolist()
            else:
                # elementwise, so the batch clipped at once is each row clipped alone
                actions = list(np.clip(out.numpy().reshape((len(live), *space.shape)), space.low, space.high)
                               .astype(space.dtype))
            running = []
            for i, action in zip(live, actions, strict=True):
                obs[i], reward, terminated, truncated, _ = envs[i].step(action)
                totals[i] += float(reward)
                if not (terminated or truncated):
                    running.append(i)
            live, steps = running, steps + 1
        return totals

    def _pool(self, size: int) -> list[Any]:
        """`size` environments of this task's id, made once and kept for later generations."""
        gym = gymnasium()
        while len(self._envs) < size:
            self._envs.append(gym.make(self.env_id))
        return self._envs[:size]


def load(path: str = "", episodes: int = 1, max_steps: int | None = None, vectorized: bool = False, seed: int = 0,
         rewards: Any = None, **unused: Any) -> GymTask:
    """`gym:ENV_ID` (e.g. `gym:CartPole-v1?episodes=4`, `gym:Pendulum-v1?vectorized=true`)."""
    if not path:
        raise SeedLedgerError("task gym: name the environment, gym:CartPole-v1")
    if rewards is not None:
        raise SeedLedgerError("task gym: the episode return is the reward; `rewards` does not apply")
    return GymTask(path, episodes, max_steps, vectorized)
