"""`make demo`: train, rebuild from the ledger, verify, export a seed file, report.

Everything the demo prints is measured in this run: held-out reward of the base and of
the model rebuilt from the ledger, the seed file's size against the weights' size.
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from importlib.resources import files
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from engine import session
from engine.commands.plot import plot_run
from engine.config import load_config
from engine.evaluator import Evaluator
from engine.models import resolve_model
from engine.progress import TrainingProgress
from engine.rebuilding import rebuild_ref, verify_ref
from ledger import Ledger
from ledger.errors import SeedLedgerError
from ledger.seedio import export_seedfile
from replay.noise import member_key

CONFIG = Path(str(files("engine") / "configs" / "demo.yaml"))  # package data: works when installed


def held_out(cfg, model_dir: Path) -> tuple[list[float | None], str, str]:
    """Per-row held-out rewards, and the first held-out question with the model's answer;
    both greedy whatever the config's `sampling` (deterministic, comparable figures)."""
    evaluator = Evaluator(cfg, model_dir)
    rewards = evaluator.held_out_rewards(cfg.evaluation.rows)
    prompt = evaluator.task.prompt(evaluator.task.test_rows()[0])
    (answer,) = evaluator.backend.generate([prompt], cfg.max_new_tokens, temperature=0.0)  # greedy, as held_out_rewards
    return rewards, prompt[-1]["content"], answer


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


def _mean(values: list[float | None]) -> float:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else 0.0


DEMO_ENTRIES = ("seedledger.db", "demo-final", "demo.seeds", "demo-reward.png", "logs")


def _fresh_workdir(workdir: Path) -> None:
    """Empty `workdir` for a fresh demo (its ledger is its own), but only if everything in it
    is what an earlier demo wrote: a mistyped --workdir must not delete someone's files."""
    if workdir.exists():
        if not workdir.is_dir():
            raise SeedLedgerError(f"demo workdir {workdir} is a file; name a directory")
        foreign = sorted(p.name for p in workdir.iterdir() if not p.name.startswith(DEMO_ENTRIES))
        if foreign:
            raise SeedLedgerError(
                f"demo workdir {workdir} holds files the demo did not write ({', '.join(foreign[:3])}); "
                "name an empty or new directory"
            )
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)


def run_demo(
    workdir: Path, generations: int | None = None, config: Path = CONFIG, overrides: list[str] = (),
) -> dict:
    console = Console(stderr=True)
    overrides = [*overrides, *([f"generations={generations}"] if generations is not None else [])]
    _fresh_workdir(workdir)
    cfg = load_config(config, overrides)

    console.rule("1. the base model")
    started = time.perf_counter()
    base_dir = resolve_model(cfg.model)
    console.print(f"{cfg.model}: {base_dir}")
    base_rewards, question, base_answer = held_out(cfg, base_dir)
    base_reward = _mean(base_rewards)
    console.print(f"held-out reward of the base model ({cfg.evaluation.rows} test rows): {base_reward:.4f}")
    console.print(f"{question!r} → {base_answer!r}", markup=False)

    console.rule(f"2. ES training, {cfg.generations} generations × {cfg.population} members")
    with Ledger.open(str(workdir / "seedledger.db")) as ledger:
        with TrainingProgress() as progress:
            result = session.start(ledger, str(config), "demo", overrides, None, progress.hooks())
        console.print(progress.summary())
        latest = ledger.latest_generation("demo")

        console.rule("3. rebuild from the ledger, verify, export")
        rebuilt = workdir / "demo-final"
        info = rebuild_ref(ledger, f"demo@{latest}", rebuilt, None, "cpu")
        verified = verify_ref(ledger, f"demo@{latest}")
        seeds = workdir / "demo.seeds"
        export_seedfile(ledger, "demo", latest, seeds, key_fn=member_key)
        final_rewards, _, final_answer = held_out(cfg, rebuilt)
        final_reward = _mean(final_rewards)
        for g, reward in ((0, base_reward), (latest, final_reward)):  # `plot` draws them
            ledger.log_event("demo", "evaluation", {"generation": g, "held_out_reward": reward,
                                                    "rows": len(base_rewards), "greedy": True})
        png = workdir / "demo-reward.png"
        plot_run(ledger, "demo", png)

    change = paired_change(base_rewards, final_rewards)
    weights = sum(f.stat().st_size for f in rebuilt.glob("*.safetensors"))
    figures = {
        "base_held_out_reward": base_reward,
        "final_held_out_reward": final_reward,
        "question": question,
        "base_answer": base_answer,
        "final_answer": final_answer,
        "held_out_rows": len(base_rewards),
        "held_out_change": change,
        "generations": latest,
        "fingerprint": info["fingerprint"],
        "verified": verified["ok"] and verified["fingerprint"] == result.fingerprint,
        "seed_file_bytes": seeds.stat().st_size,
        "safetensors_bytes": weights,
        "reward_curve": str(png),
        "seconds": time.perf_counter() - started,
    }
    table = Table(title="seedledger demo")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("held-out reward, base", f"{base_reward:.4f}")
    table.add_row("held-out reward, rebuilt final", f"{final_reward:.4f}")
    table.add_row(
        f"change on the same {len(base_rewards)} problems",
        f"{change['mean']:+.4f} ± {change['stderr']:.4f} (s.e.); "
        f"{change['better']} better, {change['worse']} worse",
    )
    table.add_row(Text(repr(question)), Text(f"base {base_answer!r}\nfinal {final_answer!r}"))
    table.add_row("fingerprint (verified by replay)", f"{info['fingerprint'][:16]}… {'ok' if figures['verified'] else 'MISMATCH'}")
    table.add_row("seed file", f"{figures['seed_file_bytes']:,} bytes ({seeds})")
    table.add_row("safetensors", f"{weights:,} bytes ({weights / figures['seed_file_bytes']:,.0f}× larger)")
    table.add_row("reward curve", str(png))
    table.add_row("wall time", f"{figures['seconds']:.0f} s")
    Console().print(table)
    return figures
