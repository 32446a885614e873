"""TRL's SFTTrainer beside the likelihood demo: same rows, same held-out check, equal wall time.

The demo (`make demo`, engine/configs/demo.yaml) trains on the likelihood of each row's
reference answer, `<answer>{answer}</answer>`: zeroth-order supervised fine-tuning. This
is the first-order kind on the same information:

- model: the config's (SmolLM2-135M-Instruct, fp32) from seedledger's model cache;
  `--peft none`: every weight (AdamW, TRL's default lr 2e-5), `--peft lora`: a LoRA
  adapter (r 16, α 32, every linear layer, lr 2e-4: LoRA wants ~10× the full lr);
- rows: the demo's training rows in seedledger's order (its generations' batches,
  flattened; sequential sampler), `batch_size` rows per step, as TRL prompt-completion
  pairs whose completion is the `loglik` reference (the answer itself where the config
  has none), loss on the completion only (TRL's default for such pairs); bf16 off;
- budget: `--seconds` of training wall time from the first step (the step in flight
  finishes); 2 threads;
- verdict: greedy held-out answers of the base and the final model on the same rows, by
  the task's own check (choosing_common: exact match of the tagged answer for the demo).

Requires the benchmark dependencies (requirements/bench.txt: TRL, installed --no-deps).

    .venv/bin/python benchmarks/sft_bench.py --seconds 300 [--peft none|lora] [--config demo]
        [--rows 100] [--lr LR] [--result FILE]
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
LR = {"none": 2e-5, "lora": 2e-4}


def reference(task, row: dict) -> str:
    """The completion SFT imitates: the `loglik` reference where the config has one (the
    demo's `<answer>{answer}</answer>`), else the row's answer."""
    likelihood = task.likelihood_rewards
    return likelihood[0].reference(row) if likelihood else str(row["answer"])


def dataset(task, cfg, steps: int):
    from datasets import Dataset

    rows = [row for batch in common.training_rows(task, cfg, steps) for row in batch]
    return Dataset.from_list([{"prompt": task.prompt(r),
                               "completion": [{"role": "assistant", "content": reference(task, r)}]}
                              for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.common_arguments(ap, "demo")
    ap.add_argument("--peft", choices=list(LR), default="none")
    ap.add_argument("--lr", type=float, help="default: 2e-5 full, 2e-4 LoRA")
    ap.add_argument("--max-steps", type=int, default=5000, help="rows prepared: this many batches")
    args = ap.parse_args()

    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    cfg, task, test, model, tok, base = common.prepared(args)

    budget = common.Budget(args.seconds, args.steps)

    class Stop(TrainerCallback):
        def on_train_begin(self, *_a, **_k):
            budget.start()

        def on_step_end(self, _args, state, control, **_k):
            if budget.step_done():
                control.should_training_stop = True

        def on_log(self, _args, state, _control, logs=None, **_k):
            if "loss" in (logs or {}):
                print(f"  sft step {state.global_step}: {budget.elapsed():.0f} s, loss {logs['loss']:.4f}", flush=True)

    peft_config = None
    if args.peft == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    lr = args.lr or LR[args.peft]
    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(
            output_dir=out, use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no",
            logging_steps=1, seed=cfg.seed, learning_rate=lr, per_device_train_batch_size=cfg.batch_size,
            train_sampling_strategy="sequential", max_steps=args.max_steps, dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = SFTTrainer(model=model, args=config, train_dataset=dataset(task, cfg, args.max_steps),
                             processing_class=tok, peft_config=peft_config, callbacks=[Stop()])
        trainer.train()
        model = trainer.model
        if args.peft == "lora":
            model = model.merge_and_unload()
        model = model.eval()
    final = common.judge(task, test, common.complete(model, tok, task, test, cfg.max_new_tokens))
    common.finish(common.report(f"trl-sft-{'full' if args.peft == 'none' else 'lora'}", base, final, budget,
                                "step", lr=lr, rows_per_step=cfg.batch_size), args.result)


if __name__ == "__main__":
    main()
