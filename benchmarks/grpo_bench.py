"""TRL's GRPO beside seedledger's reward-only run: same model, rows, reward, cores and wall time.

- model: the config's (SmolLM2-135M-Instruct, fp32) from seedledger's model cache
  (`resolve_model`), full fine-tuning, AdamW, bf16 off (its default on a CPU made steps
  ~10× slower);
- rows: seedledger's generations' batches in its order (`Task.train_batch`, no shuffling);
  one optimizer step takes one batch: `batch_size` prompts × `--group` sampled completions
  (per_device_train_batch_size = group, gradient_accumulation_steps = batch_size), so a
  step sees the rows of one seedledger generation;
- reward: the config's own reward functions and weights, imported from seedledger
  (`task.rewards`: for the reward demo the arithmetic task's `right_number` verifier), so
  both score a completion identically;
- settings: TRL 1.16's GRPO defaults (group 8, β = 0: no reference model, DAPO loss,
  temperature 1.0, ε = 0.2, one iteration per batch), except the learning rate: TRL's
  default 1e-6 is for billion-parameter models; the HF LLM course's GRPO exercise on
  SmolLM-135M-Instruct uses 2e-5 (with LoRA), and this takes 1e-5 for full fine-tuning
  (`--lr`, `--beta` to change them);
- budget: `--seconds` of training wall time from the first step (the step in flight
  finishes); 2 threads;
- verdict: greedy held-out answers of the base and the final model on the same rows, by
  the task's own check (choosing_common), paired gain ± s.e.

Requires the benchmark dependencies (requirements/bench.txt: TRL, installed --no-deps).

    .venv/bin/python benchmarks/grpo_bench.py --seconds 1800 [--config reward] [--rows 100]
        [--lr 1e-5] [--beta 0.0] [--group 8] [--result FILE]

A smoke test on SmolLM2 (one step of 2 prompts × 2 completions, 4 held-out rows):
`--seconds 60 --rows 4 --set batch_size=2 --group 2 --max-steps 20`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import choosing_common as common  # noqa: E402

common.quiet_hf()


def dataset(task, cfg, steps: int):
    """seedledger's batches for generations 1..steps, flattened in order, as TRL's
    conversational prompts with every other column kept for the reward functions."""
    from datasets import Dataset

    rows = [row for batch in common.training_rows(task, cfg, steps) for row in batch]
    return Dataset.from_list([{**{k: v for k, v in r.items() if not k.startswith("_")},
                               "prompt": task.prompt(r)} for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.common_arguments(ap, "reward")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--beta", type=float, default=0.0, help="KL coefficient (TRL 1.16's default: 0.0)")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt (TRL's num_generations)")
    ap.add_argument("--max-steps", type=int, default=2000, help="rows prepared: this many batches")
    args = ap.parse_args()

    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg, task, test, model, tok, base = common.prepared(args)

    budget = common.Budget(args.seconds, args.steps)

    class Stop(TrainerCallback):
        def on_train_begin(self, *_a, **_k):
            budget.start()

        def on_step_end(self, _args, state, control, **_k):
            if budget.step_done():
                control.should_training_stop = True
            print(f"  grpo step {state.global_step}: {budget.elapsed():.0f} s", flush=True)

    functions = [r for r in task.rewards if hasattr(r, "fn")]
    if len(functions) != len(task.rewards):
        raise SystemExit(f"{args.config}: GRPO needs decoded rewards; this config trains on a likelihood")
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no",
            logging_steps=1, seed=cfg.seed, shuffle_dataset=False, learning_rate=args.lr, beta=args.beta,
            num_generations=args.group, per_device_train_batch_size=args.group,
            gradient_accumulation_steps=cfg.batch_size, max_completion_length=cfg.max_new_tokens,
            max_steps=args.max_steps, dataloader_num_workers=0, disable_tqdm=True,
            reward_weights=[r.weight for r in functions],
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=[r.fn for r in functions], args=config,
            train_dataset=dataset(task, cfg, args.max_steps), processing_class=tok, callbacks=[Stop()],
        )
        trainer.train()
        model = trainer.model.eval()
    final = common.judge(task, test, common.complete(model, tok, task, test, cfg.max_new_tokens))
    common.finish(common.report("trl-grpo", base, final, budget, "step", lr=args.lr, beta=args.beta,
                                group=args.group, prompts_per_step=cfg.batch_size), args.result)


if __name__ == "__main__":
    main()
