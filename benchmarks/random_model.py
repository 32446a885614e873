"""A model directory with an architecture's config and tokenizer but random weights.

For throughput figures on a host without a copy of the real weights (SmolLM2-135M's are
0.5 GB): decode speed depends on the shapes, not the values. Random weights rarely emit EOS,
so every row decodes its full budget.

    python benchmarks/random_model.py SOURCE_DIR DEST_DIR [--seed 0]

SOURCE_DIR holds config.json and the tokenizer files (no weights needed).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def build(source: Path, dest: Path, seed: int = 0, **shape: int) -> int:
    """Write a random-weight model of `source`'s architecture (its config with `shape`'s
    entries changed) and `source`'s tokenizer files into `dest`; its parameter count."""
    config = AutoConfig.from_pretrained(source)
    for key, value in shape.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    for f in source.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens", "generation_config")):
            shutil.copy(f, dest / f.name)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n = build(args.source, args.dest, args.seed)
    print(f"{args.dest}: {n / 1e6:.1f}M random parameters, architecture of {args.source}")


if __name__ == "__main__":
    main()
