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

    @property
    def gains(self) -> list[float]:
        return [f - b for f, b in zip(self.final, self.base, strict=True)]

    def summary(self) -> dict:
        gain, se = paired(self.final, self.base)
        return {"kind": self.kind, "generations": self.generations, "wall_s": round(self.wall_s),
                "seconds_per_generation": round(self.wall_s / max(self.generations, 1), 2),
                "base": mean(self.base), "final": mean(self.final), "gain": round(gain, 4), "gain_se": round(se, 4),
                "seed_file_bytes": self.seed_file_bytes, "train_reward": self.train_reward}


def train_for(workdir: Path, kind: str, config: Path, overrides: list[str], seconds: float, rows: int) -> Result:
    """Train `kind` (the run's name; `overrides` on `config`) for `seconds` of wall time into
    `workdir/KIND.db` (a run already there is scored as it is), then score base and final."""
    from seedledger.engine.config import validate
    from seedledger.engine.runtime import session
    from seedledger.engine.runtime.evaluator import Evaluator
    from seedledger.engine.runtime.hooks import Hooks
    from seedledger.engine.runtime.models import resolve_model
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
        if not led.has_run(kind):
            try:
                session.start(led, str(config), kind, [*overrides, "generations=100000", "anchor_every=0"], None,
                              hooks=Hooks(on_generation_end=stop))
            except Budget:
                pass
        wall = time.perf_counter() - started
        latest = led.latest_generation(kind)
        seeds = workdir / f"{kind}.seeds"
        export_seedfile(led, kind, latest, seeds, key_fn=member_key, force=True)
        cfg = validate(led.get_run(kind).config)
        ev = Evaluator(cfg, resolve_model(cfg.model))
        base = [r or 0.0 for r in ev.held_out_rewards(rows)]
        ev.restore(led, kind, latest, None)
        final = [r or 0.0 for r in ev.held_out_rewards(rows)]
        curve = reward_curve(led.records(kind))
    return Result(kind, latest, wall, base, final, seeds.stat().st_size, curve)


def reward_curve(records, points: int = 5) -> dict[str, float]:
    """The mean training reward (the fitness on each generation's own batch) averaged over
    `points` equal stretches of the run: the signal even where greedy held-out rows stay at 0."""
    means = [r.reward_stats()["mean"] for r in records if r.index > 0 and r.reward_stats()["mean"] is not None]
    size = max(1, -(-len(means) // points))
    return {f"gens {i + 1}-{min(i + size, len(means))}": round(sum(means[i:i + size]) / len(means[i:i + size]), 4)
            for i in range(0, len(means), size)}


def differences(results: list[Result]) -> list[dict]:
    """The first kind's gain minus each other's, paired per row, with its standard error."""
    out = []
    for other in results[1:]:
        diff, se = paired(results[0].gains, other.gains)
        out.append({"gain_difference": f"{results[0].kind} - {other.kind}", "value": round(diff, 4), "se": round(se, 4)})
    return out


def mean(xs: list[float]) -> float:
    return round(sum(xs) / len(xs), 4)


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of a − b and its standard error over the pairs."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    m = sum(d) / len(d)
    var = sum((x - m) ** 2 for x in d) / (len(d) - 1)
    return m, math.sqrt(var / len(d))
