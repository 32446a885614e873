"""Held-out gain per wall-clock minute: the ES paper's loop beside seedledger, same data.

Both train SmolLM2-135M-Instruct on a config's task (default: `make demo`'s words task,
engine/configs/demo.yaml) and are scored on the same held-out rows, greedily, by one
decoding function and the task's held-out check, so the two final models and the base are
compared row by row (paired s.e.):

- seedledger with the config (and `--set` overrides); its training time T is the budget;
- the reference loop (`paper_reference_bench.Reference`: per member σ·randn on every
  weight in place, HF `generate`, subtract; θ += α·Σ zᵢεᵢ/N) with the paper's fitness, the
  decoded reward (the task's completion rewards; its own answer check when the config
  trains on `loglik`), on the rows seedledger draws for each generation, with the config's
  N, σ and α, for the same T seconds. Without a reward difference between members its
  update is zero (z = 0), so the generations with a signal are counted.

Per generation both sides print their mean member reward on that generation's rows.

    .venv/bin/python benchmarks/paper_learning_bench.py [--config FILE] [--set KEY=VALUE ...]

On a GPU (benchmarks/gpu_proof.sh): `--device cuda` puts both loops and the decoding there,
`--budget-s S` ends seedledger's training after the first generation past S seconds (the
reference then gets the same time), and `--out DIR` keeps the ledger and a seed file.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paper_reference_bench as bench  # noqa: E402
from choosing_common import complete  # noqa: E402

from seedledger.engine import api  # noqa: E402
from seedledger.engine.cli.demo import CONFIG  # noqa: E402
from seedledger.engine.config import load_config  # noqa: E402
from seedledger.engine.runtime.hooks import Hooks  # noqa: E402
from seedledger.engine.runtime.models.resolve import resolve_model  # noqa: E402
from seedledger.engine.runtime.scoring.heldout import paired_change  # noqa: E402
from seedledger.trainers.tasks import load_task  # noqa: E402


def decode(model, tok, task, rows: list[dict], new_tokens: int, batch: int = 25) -> list[float]:
    """Greedy completions of `rows` (choosing_common.complete), scored by the task."""
    done = complete(model, tok, task, rows, new_tokens, batch)
    return task.held_out_reward([task.prompt(r) for r in rows], done, rows)[0]


class WordsReference(bench.Reference):
    """The paper's loop on the words task: the rows of each generation, the decoded reward."""

    def __init__(self, model_dir: Path, task, members: int, new_tokens: int):
        super().__init__(model_dir, [], members, new_tokens)
        self.task = task
        self.rewards: list[float] = []

    def set_rows(self, rows: list[dict]) -> None:
        self.rows = rows

    def _score(self) -> float:
        self.rewards.append(statistics.fmean(decode(self.model, self.tok, self.task, self.rows, self.new_tokens)))
        return self.rewards[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=CONFIG, help="default: the demo's")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="both loops' device (seedledger's via --set device=)")
    ap.add_argument("--budget-s", type=float, help="stop seedledger's training after this many seconds")
    ap.add_argument("--out", type=Path, help="keep seedledger's ledger and seed file here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    overrides = [*args.overrides, f"device={args.device}"]
    cfg = load_config(args.config, overrides)
    bench.SIGMA, bench.ALPHA = cfg.sigma, cfg.lr
    task = load_task(cfg.task, seed=cfg.seed, base_dir=args.config.parent)
    test = task.test_rows()[: cfg.evaluation.rows]
    model_dir = resolve_model(cfg.model)
    ref = WordsReference(model_dir, task, cfg.population, cfg.max_new_tokens)
    ref.model.to(args.device)
    base = decode(ref.model, ref.tok, task, test, cfg.max_new_tokens)
    print(f"base: held-out {statistics.fmean(base):.3f} on {len(test)} rows")

    with tempfile.TemporaryDirectory() as tmp:
        ledger = (args.out or Path(tmp)) / "gpu_learning.db"
        ledger.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        def seen(record, seconds: float) -> None:
            print(f"  seedledger gen {record.index}: {seconds:5.1f} s, mean reward "
                  f"{record.reward_stats()['mean']:.3f}", flush=True)

        def over_budget() -> bool:
            return args.budget_s is not None and time.perf_counter() - started > args.budget_s

        done = api.train(str(args.config), run="ours", overrides=overrides, ledger=ledger,
                         hooks=Hooks(on_generation_end=seen, should_stop=over_budget))
        budget = time.perf_counter() - started
        model, tok = api.rebuild_model("ours", ledger=ledger, device=args.device)
        ours = decode(model, tok, task, test, cfg.max_new_tokens)
        if args.out:
            api.export("ours", args.out / "ours.seeds", ledger=ledger)
    print(f"seedledger ({done.run.config['backend']}, {args.device}): {done.latest_generation} generations in "
          f"{budget:.0f} s of training, held-out {statistics.fmean(ours):.3f}")

    spent, g, with_signal = 0.0, 0, 0
    while spent < budget:
        g += 1
        ref.set_rows(task.train_batch(cfg.seed, g, cfg.batch_size)[1])
        ref.rewards.clear()
        seconds, mean = ref.generation()
        signal = max(ref.rewards) > min(ref.rewards)
        with_signal += signal
        spent += seconds
        print(f"  reference gen {g}: {seconds:5.1f} s, mean reward {mean:.3f}, signal: {signal}", flush=True)
    theirs = decode(ref.model, ref.tok, task, test, cfg.max_new_tokens)
    print(f"reference: {spent:.0f} s, {g} generations ({with_signal} with a signal), "
          f"held-out {statistics.fmean(theirs):.3f}")

    for name, final in (("seedledger", ours), ("reference", theirs)):
        c = paired_change(base, final)
        print(f"{name:10} gain over base {c['mean']:+.3f} ± {c['stderr']:.3f} (paired s.e.; {c['better']} better, "
              f"{c['worse']} worse) = {60 * c['mean'] / budget:+.3f} per minute of training")


if __name__ == "__main__":
    main()
