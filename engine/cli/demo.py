"""`make demo`: train, rebuild from the ledger, verify, export a seed file, report.

Everything the demo prints is measured in this run: the held-out verdict of the base and
of the model rebuilt from the ledger, the seed file's size against the weights' size. The
verdict is the task's own answer check on greedy answers, whatever the config trains on:
the likelihood demo's fitness is `loglik` and its check exact match; the reward demo's
(`seedledger demo reward`) fitness and check are one verifier, the arithmetic task's
`right_number`.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from importlib.resources import files
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from seedledger.engine.cli.plot import plot_run
from seedledger.engine.config import load_config
from seedledger.engine.rebuild.rebuilding import rebuild_ref, verify_ref
from seedledger.engine.runtime import (
    Evaluator,
    HeldOutScores,
    TrainingProgress,
    compare,
    held_out_rows,
    mean_reward,
    resolve_model,
    start_session,
)
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.seedio import export_seedfile
from seedledger.replay.noise import member_key
from seedledger.trainers.rewards.combine import combine
from seedledger.trainers.tasks import load_task
from seedledger.trainers.tasks.base import as_conversation, columns_of

CONFIG = Path(str(files("seedledger.engine") / "configs" / "demo.yaml"))  # package data: works when installed
REWARD_CONFIG = Path(str(files("seedledger.engine") / "configs" / "reward.yaml"))
DEMOS = {"likelihood": (CONFIG, Path("demo-out")), "reward": (REWARD_CONFIG, Path("demo-reward-out"))}
"""`seedledger demo [NAME]`: each demo's config and default workdir."""


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


def examples(before: list[float | None], after: list[float | None], count: int = 3) -> list[int]:
    """Rows to print before/after: the first `count` the training improved, else the first rows
    (what a reader should see is whether the answers changed, not one chosen row)."""
    better = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if (a or 0.0) > (b or 0.0)]
    return (better or list(range(len(after))))[:count]


def judged(task, scores: HeldOutScores) -> HeldOutScores:
    """`scores` (the task's first rows, in order) with each row's reward replaced by the
    task's own answer check (`own_rewards`); the config's components stay beside it."""
    if task.scores_models:  # a module run's held-out seeds: no answers to check
        return scores
    rows = task.test_rows()[: len(scores.completions)]
    convo = [as_conversation(c) for c in scores.completions]
    verdict, own = combine(task.own_rewards, [task.prompt(r) for r in rows], convo, columns_of(rows))
    return replace(scores, rewards=list(verdict), components={**scores.components, **own})


def run_demo(
    workdir: Path, generations: int | None = None, config: Path = CONFIG, overrides: list[str] = (),
) -> dict:
    console = Console(stderr=True)
    overrides = [*overrides, *([f"generations={generations}"] if generations is not None else [])]
    _fresh_workdir(workdir)
    cfg = load_config(config, overrides)

    console.rule("1. the base model")
    started = time.perf_counter()
    task = load_task(cfg.task, seed=cfg.seed)
    rows = held_out_rows(task, cfg.evaluation.rows, owner="demo")  # before any model loads
    base_dir = resolve_model(cfg.model)
    console.print(f"{cfg.model}: {base_dir}")
    base = judged(task, Evaluator(cfg, base_dir, task=task).held_out_scores(rows))  # greedy, whatever `sampling`
    check = ", ".join(r.name for r in task.own_rewards)
    question, base_answer = base.questions[0], base.completions[0]
    base_reward = mean_reward(base.rewards)
    console.print(f"held-out {check} of the base model ({rows} test rows): {base_reward:.4f}")
    console.print(f"{question!r} → {base_answer!r}", markup=False)

    console.rule(f"2. ES training, {cfg.generations} generations × {cfg.population} members")
    with Ledger.open(str(workdir / "seedledger.db")) as ledger:
        with TrainingProgress() as progress:
            result = start_session(ledger, str(config), "demo", overrides, None, progress.hooks())
        console.print(progress.summary())
        latest = ledger.latest_generation("demo")

        console.rule("3. rebuild from the ledger, verify, export")
        rebuilt = workdir / "demo-final"
        info = rebuild_ref(ledger, f"demo@{latest}", rebuilt, None, "cpu")
        verified = verify_ref(ledger, f"demo@{latest}")
        seeds = workdir / "demo.seeds"
        export_seedfile(ledger, "demo", latest, seeds, key_fn=member_key)
        final = judged(task, Evaluator(cfg, rebuilt, task=task).held_out_scores(rows))  # the rebuilt files' answers
        evaluation = compare("demo", latest, "demo@0", 0, base, final)
        ledger.log_event("demo", "evaluation", evaluation.payload("demo"))  # `plot` draws it
        final_reward = evaluation.mean
        shown = examples(base.rewards, final.rewards)
        first = shown[0]
        question, base_answer, final_answer = base.questions[first], base.completions[first], final.completions[first]
        png = workdir / "demo-reward.png"
        plot_run(ledger, "demo", png)

    change = evaluation.change
    weights = sum(f.stat().st_size for f in rebuilt.glob("*.safetensors"))
    figures = {
        "held_out_check": check,
        "base_held_out_reward": base_reward,
        "final_held_out_reward": final_reward,
        "question": question,
        "base_answer": base_answer,
        "final_answer": final_answer,
        "held_out_rows": evaluation.rows,
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
    table.add_row(f"held-out {check}, base", f"{base_reward:.4f}")
    table.add_row(f"held-out {check}, rebuilt final", f"{final_reward:.4f}")
    table.add_row(
        f"change on the same {evaluation.rows} problems",
        f"{change['mean']:+.4f} ± {change['stderr']:.4f} (s.e.); "
        f"{change['better']} better, {change['worse']} worse",
    )
    for i in shown:
        answers = f"base  {base.completions[i]!r}\nfinal {final.completions[i]!r}"
        table.add_row(Text(repr(base.questions[i])), Text(answers))
    verdict = "ok" if figures["verified"] else "MISMATCH"
    table.add_row("fingerprint (verified by replay)", f"{info['fingerprint'][:16]}… {verdict}")
    table.add_row("seed file", f"{figures['seed_file_bytes']:,} bytes ({seeds})")
    table.add_row("safetensors", f"{weights:,} bytes ({weights / figures['seed_file_bytes']:,.0f}× larger)")
    table.add_row("reward curve", str(png))
    table.add_row("wall time", f"{figures['seconds']:.0f} s")
    Console().print(table)
    return figures
