"""HF backend throughput: new tokens per second at batch 16, greedy, 64 new tokens.

Runs on CPU, and on CUDA when available. Counts the tokens each row actually produced
(up to and including its EOS), and also reports decode steps x batch (the work done, since
finished rows still ride along in the batch).

    .venv/bin/python benchmarks/hf_bench.py [--model smollm2-135m-instruct] [--repeats 2] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from seedledger.engine.runtime.backends.hf import HFBackend  # noqa: E402
from seedledger.engine.runtime.models.resolve import resolve_model  # noqa: E402

QUESTIONS = [
    "What is 3+4?",
    "Name three primary colors.",
    "Write a haiku about autumn.",
    "What is the capital of France?",
    "Explain photosynthesis in one sentence.",
    "What is 12 times 11?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
    "Translate 'good morning' into Spanish.",
    "What is the boiling point of water in Celsius?",
    "Who wrote Romeo and Juliet?",
    "List two prime numbers greater than 10.",
    "What does CPU stand for?",
    "Describe the sea in five words.",
    "What is the square root of 81?",
    "Suggest a name for a cat.",
]


def bench(model_dir: Path, device: str, dtype: torch.dtype, batch: int, new: int, repeats: int) -> dict:
    backend = HFBackend(model_dir, device=device, dtype=dtype, batch_size=batch)
    prompts = [[{"role": "user", "content": q}] for q in (QUESTIONS * (batch // 16 + 1))[:batch]]
    backend.generate(prompts, max_new_tokens=4)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        ids = backend.generate_ids(prompts, max_new_tokens=new)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    produced = sum(len(row) for row in ids)
    return {
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "seconds": best,
        "tokens": produced,
        "tokens_per_s": produced / best,
        "slot_tokens_per_s": batch * new / best,
        "sample": backend.tokenizer.decode(ids[0], skip_special_tokens=True),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    runs = [("cpu", torch.float32)]
    if torch.cuda.is_available():
        runs += [("cuda", torch.float32), ("cuda", torch.bfloat16)]
    else:
        print("CUDA not available: CPU figures only")
    for device, dtype in runs:
        r = bench(model_dir, device, dtype, args.batch, args.new_tokens, args.repeats)
        print(
            f"{args.model} {r['device']} {r['dtype']} batch={args.batch} new={args.new_tokens} "
            f"threads={r['threads']}: {r['tokens_per_s']:.1f} tokens/s generated "
            f"({r['tokens']} tokens in {r['seconds']:.2f}s; {r['slot_tokens_per_s']:.1f} "
            f"batch-slot tokens/s)  sample: {r['sample'][:40]!r}"
        )


if __name__ == "__main__":
    main()
