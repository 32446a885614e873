"""ES, GRPO or SFT? Every method on one task at one wall-clock budget, one after another, each
in a process of its own; per method: held-out base → final on the same rows, paired gain ±
s.e., rows better/worse, the held-out training reward (the config's decoded fitness on the
same rows, greedy) base → final with its paired s.e., steps per minute and peak RSS (the
kernel's figure for that process).

Methods (`--methods`, in this order):
- `seedledger`: the config as shipped (`api.train`), stopped after the first generation past
  the budget; the final model rebuilt from the ledger (`api.rebuild_model`);
- `paper`: the ES paper's loop (paper_reference_bench.Reference: full-rank σ·randn on every
  weight, one HF `generate` per member, subtract; θ += α·Σ zᵢεᵢ/N) with the config's decoded
  reward on seedledger's rows of each generation, N = the config's population, the paper's
  σ = 0.001 and α = 0.0005 (`--paper-sigma`, `--paper-alpha`);
- `grpo`: TRL's GRPOTrainer (grpo_bench.py), `sft-full` and `sft-lora`: TRL's SFTTrainer
  (sft_bench.py; the likelihood demo's counterpart).
All decode the held-out rows with one function (choosing_common.complete) and judge them by
the task's own check, so the base figure is the same for every method.

The measurements for docs/choosing.md, on a quiet machine (nothing else running; 2 cores):

    # reward only (engine/configs/reward.yaml: the arithmetic `number` verifier), 30 minutes each
    .venv/bin/python benchmarks/choosing_bench.py --config reward --seconds 1800 \\
        --methods seedledger grpo paper --out bench-out/reward
    # the reference answer known (engine/configs/demo.yaml: `loglik`), 5 minutes each
    .venv/bin/python benchmarks/choosing_bench.py --config demo --seconds 300 \\
        --methods seedledger sft-full sft-lora --out bench-out/sft

A smoke test of the plumbing, every method on the random `tiny` model (about 5 minutes on a
loaded 2-core machine): `--set model=tiny --set population=2 --set batch_size=2 --seconds 5
--rows 2`. On SmolLM2 a budget below one step still runs one step (a GRPO step of 8 prompts
× 8 completions takes minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import choosing_common as common  # noqa: E402
from equal_wall import paired  # noqa: E402

HERE = Path(__file__).resolve().parent
SCRIPTS = {"grpo": ("grpo_bench.py", []), "sft-full": ("sft_bench.py", ["--peft", "none"]),
           "sft-lora": ("sft_bench.py", ["--peft", "lora"])}
OWN = ("seedledger", "paper")


def seedledger(args, cfg, task, test: list[dict], where: Path) -> dict:
    """The config as shipped, for the budget; held-out verdicts of base and rebuilt final."""
    from seedledger.engine import api
    from seedledger.engine.runtime.hooks import Hooks

    budget = common.Budget(args.seconds, args.steps)
    spent = False

    def end(record, seconds: float) -> None:
        nonlocal spent
        spent = budget.step_done()
        print(f"  seedledger gen {record.index}: {seconds:.1f} s, mean reward {record.reward_stats()['mean']:.4f}",
              flush=True)

    model, tok = common.base_model(cfg)
    base = common.judge(task, test, common.complete(model, tok, task, test, cfg.max_new_tokens))
    del model
    ledger = where / "seedledger.db"
    api.train(str(common.config_path(args.config)), run="bench", ledger=ledger,
              overrides=[*args.overrides, "generations=100000", "anchor_every=0"],
              hooks=Hooks(on_generation_start=lambda *_: budget.start(), on_generation_end=end,
                          should_stop=lambda: spent))
    model, tok = api.rebuild_model("bench", ledger=ledger)
    final = common.judge(task, test, common.complete(model, tok, task, test, cfg.max_new_tokens))
    return common.report("seedledger", base, final, budget, "generation", config=args.config)


def paper(args, cfg, task, test: list[dict], where: Path) -> dict:
    """The paper's loop on the config's rows and decoded reward, for the budget."""
    import paper_learning_bench as learning
    import paper_reference_bench as reference

    from seedledger.engine.runtime.models.resolve import resolve_model

    reference.SIGMA, reference.ALPHA = args.paper_sigma, args.paper_alpha
    ref = learning.WordsReference(resolve_model(cfg.model), task, cfg.population, cfg.max_new_tokens)
    base = common.judge(task, test, common.complete(ref.model, ref.tok, task, test, cfg.max_new_tokens))
    budget, with_signal = common.Budget(args.seconds, args.steps), 0
    budget.start()
    while True:
        ref.set_rows(task.train_batch(cfg.seed, budget.steps + 1, cfg.batch_size)[1])
        ref.rewards.clear()
        seconds, mean = ref.generation()
        with_signal += max(ref.rewards) > min(ref.rewards)
        print(f"  paper gen {budget.steps + 1}: {seconds:.1f} s, mean reward {mean:.4f}", flush=True)
        if budget.step_done():
            break
    final = common.judge(task, test, common.complete(ref.model, ref.tok, task, test, cfg.max_new_tokens))
    return common.report("paper-loop", base, final, budget, "generation", generations_with_signal=with_signal,
                         sigma=args.paper_sigma, alpha=args.paper_alpha)


def command(method: str, args, result: Path) -> list[str]:
    """The process that runs `method` and writes its report to `result`."""
    shared = ["--config", args.config, "--seconds", str(args.seconds), "--result", str(result),
              *[f"--set={o}" for o in args.overrides], *(["--rows", str(args.rows)] if args.rows else []),
              *(["--steps", str(args.steps)] if args.steps else [])]
    if method in OWN:
        return [sys.executable, str(Path(__file__).resolve()), "--one", method, *shared,
                "--paper-sigma", str(args.paper_sigma), "--paper-alpha", str(args.paper_alpha)]
    script, extra = SCRIPTS[method]
    return [sys.executable, str(HERE / script), *shared, *extra]


def one(args) -> None:
    """`--one METHOD`: run one of ours in this process and write its report."""
    import torch

    common.quiet_hf()
    torch.set_num_threads(args.threads)
    cfg, task = common.bench_task(args.config, args.overrides)
    test = task.test_rows()[: args.rows or cfg.evaluation.rows or len(task.test_rows())]
    with tempfile.TemporaryDirectory() as tmp:
        r = {"seedledger": seedledger, "paper": paper}[args.one](args, cfg, task, test, Path(tmp))
    common.finish(r, args.result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="reward", help="reward (default), words, demo, arithmetic or a path")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--seconds", type=float, required=True, help="training wall time per method")
    ap.add_argument("--steps", type=int, help="stop each method after this many steps too (generations or"
                    " optimizer steps): equal steps where a loaded machine makes seconds meaningless")
    ap.add_argument("--methods", nargs="+", choices=[*OWN, *SCRIPTS], default=["seedledger", "grpo", "paper"])
    ap.add_argument("--rows", type=int, help="held-out rows (default: the config's evaluation.rows)")
    ap.add_argument("--paper-sigma", type=float, default=0.001)
    ap.add_argument("--paper-alpha", type=float, default=0.0005)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, help="keep each method's report (JSON) here")
    ap.add_argument("--one", choices=OWN, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args)
        return
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for method in args.methods:
            print(f"== {method}: {args.seconds:.0f} s on {args.config}", flush=True)
            reports.append(common.run_isolated(command(method, args, out / f"{method}.json"), out / f"{method}.json"))
    print(f"\n{args.config}, {args.seconds:.0f} s of training per method, {reports[0]['rows']} held-out rows")
    print(common.HEADER)
    for r in reports:
        print(common.line(r))
    if any(r["base_rows"] != reports[0]["base_rows"] for r in reports):
        print("warning: the methods' base verdicts differ row by row (decoding is not deterministic here)")
    for i, a in enumerate(reports):  # gain differences, paired per row
        for b in reports[i + 1:]:
            diff, se = paired([f - x for f, x in zip(a["final_rows"], a["base_rows"], strict=True)],
                              [f - x for f, x in zip(b["final_rows"], b["base_rows"], strict=True)])
            rdiff, rse = paired([f - x for f, x in zip(a["final_reward_rows"], a["base_reward_rows"], strict=True)],
                                [f - x for f, x in zip(b["final_reward_rows"], b["base_reward_rows"], strict=True)])
            print(f"gain {a['method']} − {b['method']}: {diff:+.3f} ± {se:.3f}"
                  f" (held-out reward {rdiff:+.4f} ± {rse:.4f})")
    print(json.dumps(reports))


if __name__ == "__main__":
    main()
