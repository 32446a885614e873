"""Held-out gain at equal wall time: one ES run per kind, each stopped once `seconds` have
passed (the generation in flight finishes), then the base model and the final one score the
same held-out rows greedily, so the gains pair row by row. Shared by lora_bench.py and
quant_bench.py, whose `learn` commands differ only in the kinds they compare.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"arithmetic": ROOT / "configs" / "arithmetic.yaml"}  # and "demo": the packaged demo's


def config_path(name: str) -> Path:
    """The training config `--config` names: 'demo' (the packaged demo's: words, likelihood
    fitness), 'arithmetic' (configs/arithmetic.yaml: decoded answers, exact match) or a path."""
    if name == "demo":
        from seedledger.engine.cli.demo import CONFIG

        return Path(CONFIG)
    return CONFIGS.get(name, Path(name))


@dataclass
class Result:
    kind: str
    generations: int
    wall_s: float
    base: list[float]  # per held-out row
    final: list[float]
    seed_file_bytes: int
    train_reward: dict[str, float]
    base_loglik: list[float] | None = None  # per held-out row, where the task has a likelihood reward
    final_loglik: list[float] | None = None

    @property
    def gains(self) -> list[float]:
        return _gains(self.final, self.base)

    def summary(self) -> dict:
        gain, se = paired(self.final, self.base)
        out = {"kind": self.kind, "generations": self.generations, "wall_s": round(self.wall_s),
               "seconds_per_generation": round(self.wall_s / max(self.generations, 1), 2),
               "base": mean(self.base), "final": mean(self.final), "gain": round(gain, 4), "gain_se": round(se, 4),
               "seed_file_bytes": self.seed_file_bytes, "train_reward": self.train_reward}
        if self.final_loglik is not None:
            gain, se = paired(self.final_loglik, self.base_loglik)
            out["held_out_loglik"] = {"base": mean(self.base_loglik), "final": mean(self.final_loglik),
                                      "gain": round(gain, 4), "gain_se": round(se, 4)}
        return out


def train_for(workdir: Path, kind: str, config: Path, overrides: list[str], seconds: float, rows: int) -> Result:
    """Train `kind` (the run's name; `overrides` on `config`) for `seconds` of wall time into
    `workdir/KIND.db`, then score base and final. A run already there is scored as it is, its
    wall time read from the ledger (the run's creation to its last commit)."""
    from seedledger.engine.config import validate
    from seedledger.engine.runtime import session
    from seedledger.engine.runtime.hooks import Hooks
    from seedledger.engine.runtime.models.resolve import resolve_model
    from seedledger.engine.runtime.scoring.evaluator import Evaluator
    from seedledger.ledger import Ledger
    from seedledger.ledger.seedio import export_seedfile
    from seedledger.replay.noise import member_key

    class Budget(Exception):
        pass

    started = time.perf_counter()

    def stop(_record, _seconds) -> None:
        if time.perf_counter() - started > seconds:
            raise Budget()

    with Ledger.open(str(workdir / f"{kind}.db")) as led:
        trained_here = not led.has_run(kind)
        if trained_here:
            try:
                session.start(led, str(config), kind, [*overrides, "generations=100000", "anchor_every=0"], None,
                              hooks=Hooks(on_generation_end=stop))
            except Budget:
                pass
        records, run = led.records(kind), led.get_run(kind)
        wall = (time.perf_counter() - started if trained_here
                else (records[-1].committed_at - run.created_at).total_seconds())
        latest = led.latest_generation(kind)
        seeds = workdir / f"{kind}.seeds"
        export_seedfile(led, kind, latest, seeds, key_fn=member_key, force=True)
        cfg = validate(run.config)
        ev = Evaluator(cfg, resolve_model(cfg.model))
        base, base_loglik = [r or 0.0 for r in ev.held_out_rewards(rows)], held_out_loglik(ev, rows)
        ev.restore(led, kind, latest, None)
        final, final_loglik = [r or 0.0 for r in ev.held_out_rewards(rows)], held_out_loglik(ev, rows)
    return Result(kind, latest, wall, base, final, seeds.stat().st_size, reward_curve(records), base_loglik,
                  final_loglik)


def held_out_loglik(ev, rows: int) -> list[float] | None:
    """The evaluator's current master's mean log-probability of each held-out row's reference
    answer (the task's first likelihood reward, as training scores it; one member at scale 0,
    so the master itself): the dense held-out figure beside the greedy verdict. None when the
    task trains on no likelihood."""
    from seedledger.engine.runtime.backends.base import Population

    if not ev.task.likelihood_rewards:
        return None
    test = ev.task.test_rows()[:rows]
    prompts = [ev.task.prompt(row) for row in test]
    references = ev.task.likelihood_rewards[0].references(test)
    master = Population(keys=(0,), signs=(0,), sigma=ev.cfg.sigma, seeds=(None,))
    return ev.backend.loglik(ev.master, master, prompts, references).scores[0]


def reward_curve(records, points: int = 5) -> dict[str, float]:
    """The mean training reward (the fitness on each generation's own batch) averaged over
    `points` equal stretches of the run: the signal even where greedy held-out rows stay at 0."""
    means = [m for m in (r.reward_stats()["mean"] for r in records if r.index > 0) if m is not None]
    size = max(1, -(-len(means) // points))
    return {f"gens {i + 1}-{min(i + size, len(means))}": round(sum(means[i:i + size]) / len(means[i:i + size]), 4)
            for i in range(0, len(means), size)}


def differences(results: list[Result]) -> list[dict]:
    """Each kind's gain minus every later one's, paired per row, with its standard error
    (greedy held-out reward; held-out likelihood too where both have it)."""
    out = []
    for i, one in enumerate(results):
        for other in results[i + 1:]:
            line = {"gain_difference": f"{one.kind} - {other.kind}"}
            line["value"], line["se"] = (round(x, 4) for x in paired(one.gains, other.gains))
            if one.final_loglik is not None and other.final_loglik is not None:
                diff, se = paired(_gains(one.final_loglik, one.base_loglik),
                                  _gains(other.final_loglik, other.base_loglik))
                line["loglik"] = {"value": round(diff, 4), "se": round(se, 4)}
            out.append(line)
    return out


def _gains(final: list[float], base: list[float]) -> list[float]:
    return [f - b for f, b in zip(final, base, strict=True)]


def mean(xs: list[float]) -> float:
    return round(sum(xs) / len(xs), 4)


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of a − b and its standard error over the pairs."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    m = sum(d) / len(d)
    var = sum((x - m) ** 2 for x in d) / (len(d) - 1)
    return m, math.sqrt(var / len(d))
