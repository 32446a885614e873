"""ES over int8 scales (`train: quant_scales`) and int8 codes (`train: quant_codes`, QES)
against LoRA-ES on the int8 base and full-precision low-rank ES, on SmolLM2 with the HF
backend, at the same wall time.

    learn   each kind trains `--config` (the demo's: words, likelihood fitness; or
            configs/arithmetic.yaml, exact match of decoded answers) until `--seconds` of wall time have
            passed (the generation in flight then finishes); base and final model score
            the same held-out rows greedily: gain with its paired standard error, seconds
            per generation, the seed file's size at the end, and the training reward's
            curve (its mean over five stretches of the run)
    memory  peak resident memory of one generation of each kind through the real loop,
            a fresh process per kind (benchmarks/lora_bench.py's `_generation`)

    .venv/bin/python benchmarks/quant_bench.py learn [--seconds 1800] [--rows 100] [--config demo]
    PYTHONPATH=.venv/int8 .venv/bin/python benchmarks/quant_bench.py memory

`lora-int8` needs torchao (`make` installs it in .venv/int8; without it that kind is
skipped with the reason). Timings need a quiet machine: nothing else running.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import lora_bench  # noqa: E402  (its environment set-up and one-generation runner)
from equal_wall import config_path, differences, train_for  # noqa: E402

MODEL = lora_bench.MODEL
KINDS = {  # config overrides per kind, σ and lr on each kind's own scale
    "quant_scales": ["perturbation=full", "train=quant_scales", "sigma=2e-5", "lr=1e-5"],
    "quant_codes": ["perturbation=full", "train=quant_codes", "optimizer=adam", "sigma=1e-3", "lr=5e-4"],
    "lora-int8": ["perturbation=full", "train.kind=lora", "train.rank=8", "base_quantization=int8",
                  "sigma=1e-2", "lr=5e-3"],
    "lowrank": ["perturbation=lowrank"],  # rank 1, the config's σ and lr
}
lora_bench.KINDS.update(KINDS)  # so that `lora_bench.py _generation KIND` runs these too


def learn(args) -> None:
    from seedledger.ledger.errors import SeedLedgerError

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="quant-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for kind in args.kinds:
        try:
            results.append(train_for(workdir, kind, config_path(args.config), KINDS[kind] + [f"model={args.model}"],
                                     args.seconds, args.rows))
        except SeedLedgerError as exc:  # e.g. lora-int8 without torchao
            print(json.dumps({"kind": kind, "skipped": str(exc)}))
            continue
        print(json.dumps(results[-1].summary()))
    for line in differences(results):
        print(json.dumps(line))


def memory(args) -> None:
    for kind in args.kinds:
        proc = subprocess.run([sys.executable, __file__, "_generation", kind, "--model", args.model],
                              capture_output=True, text=True, cwd=ROOT)
        out = proc.stdout.strip()
        print(out.splitlines()[-1] if out else json.dumps({"kind": kind, "failed": proc.stderr[-300:]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["learn", "memory", "_generation"])
    ap.add_argument("kind", nargs="?", choices=list(KINDS))
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--kinds", nargs="*", default=list(KINDS))
    ap.add_argument("--seconds", type=float, default=1800)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--config", default="demo",
                    help="'demo' (the demo's task and settings), 'arithmetic' (configs/arithmetic.yaml) or a path")
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--workdir")
    args = ap.parse_args()
    if args.what == "_generation":
        lora_bench.one_generation(args)
    else:
        {"learn": learn, "memory": memory}[args.what](args)


if __name__ == "__main__":
    main()
