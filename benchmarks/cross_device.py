"""Cross-device replay through the console script: train on one device, verify on the other.

Each variant (full-rank sgd / adam, low-rank momentum, LoRA, LM-MA-ES on LoRA, a GA with
survivors on full rank and on LoRA, likelihood fitness on full rank and low rank, the int8
kinds quant_scales and quant_codes, and a module run: an MLP, tests/support/device_cases.py)
trains the `tiny` model (the MLP for `module`) for `--generations` generations twice, once
with `device: cuda` and once on the CPU, then `seedledger verify` replays each run on the
other device. A run verifies only
when every generation's fingerprint matches bit for bit, so a pass means CPU and CUDA
produce the same noise, perturbed weights and updates for that variant end to end.

`--verify-only LEDGER` replays every run of an existing ledger on `--device` (a ledger
trained on another machine, say), and `--copy-ledger PATH` keeps this run's ledger.

    python benchmarks/cross_device.py [--generations 20] [--variants full-sgd lora ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import device_cases  # noqa: E402  (an MLP and its fitness, on any device)
from tests.support.configs import TINY  # noqa: E402  (the suite's tiny config: rewards that vary)

VARIANTS = {
    "full-sgd": {},
    "full-adam": {"optimizer": {"name": "adam"}, "lr": 1e-3},
    "lowrank-momentum": {"perturbation": {"kind": "lowrank", "rank": 4}, "optimizer": {"name": "momentum"}},
    "lora-sgd": {"train": {"kind": "lora", "rank": 4}, "sigma": 0.01, "lr": 0.005},
    "lora-lmmaes": {"train": {"kind": "lora", "rank": 4}, "algorithm": "lmmaes", "mirrored": False,
                    "sigma": 0.01, "lr": 0.005},
    # survivors as offsets in the replay state (the paths rule's mix/noise form)
    "full-ga-survivors": {"algorithm": "ga", "ga": {"survivors": 2}, "mirrored": False, "lr": 1.0},
    "lora-ga-survivors": {"train": {"kind": "lora", "rank": 4}, "algorithm": "ga", "ga": {"survivors": 3},
                          "mirrored": False, "sigma": 0.5, "lr": 1.0},
    # dense likelihood fitness (teacher-forced scores of the reference answer, no decoding)
    "loglik-full": {"task": {"name": "arithmetic", "rewards": ["loglik"]}},
    "loglik-lowrank": {"task": {"name": "arithmetic", "rewards": ["loglik"]},
                       "perturbation": {"kind": "lowrank", "rank": 4}},
    # int8 weight-only kinds (docs/quantized.md), as tests/test_quant_*.py configure them
    "quant-scales": {"train": {"kind": "quant_scales", "targets": ["q_proj", "v_proj", "down_proj"]},
                     "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 30}]},
                     "max_new_tokens": 6, "sigma": 1e-4, "lr": 1e-4},
    "quant-codes": {"train": {"kind": "quant_codes", "targets": ["q_proj", "v_proj", "down_proj"]},
                    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 30}]},
                    "max_new_tokens": 6, "sigma": 1e-3, "lr": 6e-4, "optimizer": "adam"},
    # any nn.Module (the module backend): an MLP named by file path, its fitness on the module's device
    "module": {"model": device_cases.MODEL, "task": device_cases.TASK, "population": 8, "sigma": 0.0625,
               "lr": 0.125},
}


def seedledger(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("seedledger") or str(Path(sys.executable).with_name("seedledger"))
    return subprocess.run([exe, *args], capture_output=True, text=True)


def train(ledger: str, workdir: Path, name: str, overrides: dict, device: str, generations: int) -> float:
    cfg = workdir / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, **overrides, "generations": generations, "device": device}))
    t0 = time.perf_counter()
    p = seedledger("train", str(cfg), "--run", name, "--ledger", ledger)
    if p.returncode != 0:
        raise SystemExit(f"train {name} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return time.perf_counter() - t0


def verify(ledger: str, run: str, device: str) -> tuple[bool, str, float]:
    t0 = time.perf_counter()
    p = seedledger("verify", run, "--device", device, "--ledger", ledger, "--json")
    seconds = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        return False, f"verify failed ({p.returncode}): {p.stderr.strip()[-400:]}", seconds
    doc = json.loads(p.stdout)
    return p.returncode == 0, json.dumps(doc), seconds


def runs_of(ledger: str) -> list[str]:
    p = seedledger("log", "--ledger", ledger, "--json")
    if p.returncode != 0:
        raise SystemExit(f"log failed: {p.stderr.strip()}")
    doc = json.loads(p.stdout)
    return [r["name"] for r in (doc["runs"] if isinstance(doc, dict) else doc)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generations", type=int, default=20)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--verify-only", metavar="LEDGER", help="replay every run of LEDGER on --device")
    ap.add_argument("--device", default="cuda", help="with --verify-only: the replay device")
    ap.add_argument("--runs", nargs="+", help="with --verify-only: only these runs")
    ap.add_argument("--copy-ledger", metavar="PATH", help="keep this run's ledger at PATH")
    ap.add_argument("--devices", nargs=2, default=["cuda", "cpu"], help="the two devices (cpu cpu checks the script)")
    args = ap.parse_args()
    failures = 0
    if args.verify_only:
        for run in args.runs or runs_of(args.verify_only):
            ok, detail, seconds = verify(args.verify_only, run, args.device)
            failures += not ok
            print(f"{run:28} verify on {args.device}: {'OK' if ok else 'MISMATCH'} ({seconds:.1f} s) {detail}")
        raise SystemExit(1 if failures else 0)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        ledger = str(workdir / "cross.db")
        for variant in args.variants:
            a, b = args.devices
            finals: list[str | None] = []
            for i, (trained, replayed) in enumerate(((a, b), (b, a))):
                run = f"{variant}-{i}-{trained}-to-{replayed}"
                t_train = train(ledger, workdir, run, VARIANTS[variant], trained, args.generations)
                ok, detail, t_verify = verify(ledger, run, replayed)
                failures += not ok
                print(f"{run:28} trained on {trained} ({t_train:5.1f} s), verify on {replayed}: "
                      f"{'OK' if ok else 'MISMATCH'} ({t_verify:.1f} s) {detail}", flush=True)
                finals.append(json.loads(detail)["fingerprint"] if ok else None)
            # Not required (greedy decoding may break a near-tie differently on each device),
            # but worth knowing: the same config trained on either device, same weights?
            same = finals[0] is not None and finals[0] == finals[1]
            print(f"{variant}: the {a}- and {b}-trained runs end at {'the same' if same else 'different'} fingerprints")
        if args.copy_ledger:
            shutil.copy(ledger, args.copy_ledger)
    print(f"{len(args.variants) * 2 - failures} of {len(args.variants) * 2} runs verified across devices")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
