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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import lora_bench  # noqa: E402  (its environment set-up, paired statistics, one-generation runner)

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
    from seedledger.engine.config import validate
    from seedledger.engine.runtime import session
    from seedledger.engine.runtime.evaluator import Evaluator
    from seedledger.engine.runtime.hooks import Hooks
    from seedledger.engine.runtime.models import resolve_model
    from seedledger.ledger import Ledger
    from seedledger.ledger.errors import SeedLedgerError
    from seedledger.ledger.seedio import export_seedfile
    from seedledger.replay.noise import member_key

    class Budget(Exception):
        pass

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="quant-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    gains = {}
    for kind in args.kinds:
        ledger_path = workdir / f"{kind}.db"
        started = time.perf_counter()

        def stop(record, _seconds, started=started):
            if time.perf_counter() - started > args.seconds:
                raise Budget()

        overrides = KINDS[kind] + [f"model={args.model}", "generations=100000", "anchor_every=0"]
        try:
            with Ledger.open(str(ledger_path)) as led:
                if not led.has_run(kind):
                    try:
                        session.start(led, str(args.config), kind, overrides, None,
                                      hooks=Hooks(on_generation_end=stop))
                    except Budget:
                        pass
                wall = time.perf_counter() - started
                run = led.get_run(kind)
                latest = led.latest_generation(kind)
                seeds = workdir / f"{kind}.seeds"
                export_seedfile(led, kind, latest, seeds, key_fn=member_key, force=True)
                cfg = validate(run.config)
                ev = Evaluator(cfg, resolve_model(cfg.model))
                base = [r or 0.0 for r in ev.held_out_rewards(args.rows)]
                ev.restore(led, kind, latest, None)
                final = [r or 0.0 for r in ev.held_out_rewards(args.rows)]
                curve = _reward_curve(led.records(kind))
        except SeedLedgerError as exc:  # e.g. lora-int8 without torchao
            print(json.dumps({"kind": kind, "skipped": str(exc)}))
            continue
        gain, se = lora_bench._paired(final, base)
        gains[kind] = [f - b for f, b in zip(final, base, strict=True)]
        print(json.dumps({"kind": kind, "generations": latest, "wall_s": round(wall),
                          "seconds_per_generation": round(wall / max(latest, 1), 2),
                          "base": lora_bench._mean(base), "final": lora_bench._mean(final),
                          "gain": round(gain, 4), "gain_se": round(se, 4), "seed_file_bytes": seeds.stat().st_size,
                          "train_reward": curve}))
    kinds = list(gains)
    for other in kinds[1:]:
        diff, se = lora_bench._paired(gains[kinds[0]], gains[other])
        print(json.dumps({"gain_difference": f"{kinds[0]} - {other}", "value": round(diff, 4), "se": round(se, 4)}))


def _reward_curve(records, points: int = 5) -> dict[str, float]:
    """The mean training reward (the fitness, on each generation's own batch) averaged over
    `points` equal stretches of the run: the signal even where greedy held-out rows stay at 0."""
    means = [r.reward_stats()["mean"] for r in records if r.index > 0 and r.reward_stats()["mean"] is not None]
    size = max(1, -(-len(means) // points))
    return {f"gens {i + 1}-{min(i + size, len(means))}": round(sum(means[i:i + size]) / len(means[i:i + size]), 4)
            for i in range(0, len(means), size)}


def _config(name: str) -> Path:
    """The training config `--config` names: the packaged demo's, the arithmetic one, or a file."""
    from seedledger.engine.cli.demo import CONFIG

    return {"demo": CONFIG, "arithmetic": ROOT / "configs" / "arithmetic.yaml"}.get(name, Path(name))


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
    ap.add_argument("--config", type=_config, default="demo",
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
