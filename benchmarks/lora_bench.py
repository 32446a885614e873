"""LoRA-ES against low-rank full-parameter ES on SmolLM2, HF backend, this machine.

    speed   one generation's evaluation, same members, rows and new tokens: seconds to
            build the members' terms (LoRA: every member's perturbed adapter; low-rank:
            the factors), seconds to decode, generated tokens/s
    memory  peak resident memory (ru_maxrss) of one ES generation run by the real loop
            (`session.start`, 1 generation) in a fresh process per kind: full-parameter,
            low-rank, LoRA, LoRA on an int8 base; also the resident memory after it
    learn   held-out reward gain at equal wall time (`equal_wall`), LoRA-ES vs low-rank
            full-parameter ES, with paired standard errors over the same test rows, on
            `--config` (default configs/arithmetic.yaml; 'demo': the demo's words task)

    .venv/bin/python benchmarks/lora_bench.py speed [--members 8] [--prompts 8] [--new-tokens 32]
    .venv/bin/python benchmarks/lora_bench.py memory
    .venv/bin/python benchmarks/lora_bench.py learn [--seconds 1800] [--rows 200] [--config arithmetic]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from benchmarks.population_common import QUESTIONS, lora_perturbation, members, trained_adapter  # noqa: E402
from seedledger.engine.runtime.models.resolve import quiet_hf_env  # noqa: E402

quiet_hf_env()  # torchao's import chatter (transformers imports it when installed)

MODEL = "smollm2-135m-instruct"
KINDS = {  # config overrides per kind (the rest: configs/arithmetic.yaml, whose own kind is not assumed)
    "full": ["perturbation=full"],
    "lowrank": ["perturbation=lowrank"],  # rank 1
    "lora": ["perturbation=full", "train.kind=lora", "train.rank=8"],
    "lora-int8": ["perturbation=full", "train.kind=lora", "train.rank=8", "base_quantization=int8"],
}


# ----------------------------------------------------------------------------- speed


def speed(args) -> None:
    import torch

    from seedledger.engine.runtime.backends.hf import HFBackend
    from seedledger.engine.runtime.models.resolve import resolve_model
    from seedledger.replay import noise
    from seedledger.replay.perturbation import Perturbation

    model_dir = resolve_model(args.model)
    prompts = [[{"role": "user", "content": q}] for q in (QUESTIONS * 8)[: args.prompts]]
    keys, signs = members(args.members)
    rows = [q for _ in keys for q in prompts]
    sigma = noise.round_coefficient(1e-3)
    kinds = {f"low-rank r={r}": Perturbation.lowrank(r) for r in args.lowrank_ranks}
    kinds |= {f"LoRA r={r}": lora_perturbation(r) for r in args.lora_ranks}
    print(f"{args.members} members × {args.prompts} prompts = {len(rows)} rows, {args.new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads")
    for label, p in kinds.items():
        backend = HFBackend(model_dir, perturbation=p)
        master = backend.master()
        if p.adapter is not None:
            master = trained_adapter(master)
        backend.load_master(master)
        backend._decode(rows[:4], [None] * 4, 2, batch=4)  # warm-up
        best = None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            with backend.members(master, keys, signs, sigma):
                t1 = time.perf_counter()
                ids = backend._decode(rows, [None] * len(rows), args.new_tokens, batch=len(rows))
            t2 = time.perf_counter()
            tokens = sum(len(r) for r in ids)
            run = {"kind": label, "build_s": round(t1 - t0, 3), "decode_s": round(t2 - t1, 2),
                   "tokens": tokens, "tokens_per_s": round(tokens / (t2 - t0), 1)}
            best = run if best is None or run["tokens_per_s"] > best["tokens_per_s"] else best
        print(json.dumps(best))
        del backend


# ----------------------------------------------------------------------------- memory


def memory(args) -> None:
    for kind in args.kinds:
        proc = subprocess.run([sys.executable, __file__, "_generation", kind, "--model", args.model],
                              capture_output=True, text=True, cwd=ROOT)
        line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
        print(line)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_generation(args) -> None:
    """One ES generation of `kind` through the real loop, in this fresh process."""
    from seedledger.engine.runtime import session
    from seedledger.ledger import Ledger

    overrides = KINDS[args.kind] + [f"model={args.model}", "generations=1", "anchor_every=0",
                                    f"population={args.population}", f"batch_size={args.batch}",
                                    f"max_new_tokens={args.new_tokens}"]
    with tempfile.TemporaryDirectory() as tmp, Ledger.open(str(Path(tmp) / "l.db")) as led:
        t0 = time.perf_counter()
        session.start(led, str(ROOT / "configs" / "arithmetic.yaml"), "m", overrides, 1)
        seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"kind": args.kind, "peak_rss_mb": round(peak), "rss_after_mb": round(_rss_mb()),
                      "seconds": round(seconds, 1), "population": args.population,
                      "rows_per_member": args.batch, "new_tokens": args.new_tokens}))


# ----------------------------------------------------------------------------- learning


def learn(args) -> None:
    """Each kind trains `--config` for `--seconds` of wall time (`equal_wall`); base and final
    score the same test rows."""
    from equal_wall import config_path, differences, train_for

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="lora-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for kind in args.learn_kinds:
        overrides = KINDS[kind] + [f"model={args.model}"]
        overrides += [f"sigma={args.sigma}", f"lr={args.lr}"] if kind.startswith("lora") else []
        results.append(train_for(workdir, kind, config_path(args.config), overrides, args.seconds, args.rows))
        print(json.dumps(results[-1].summary()))
    for line in differences(results):
        print(json.dumps(line))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", default="speed", choices=["speed", "memory", "learn", "_generation"])
    ap.add_argument("kind", nargs="?", choices=list(KINDS))
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--lowrank-ranks", type=int, nargs="*", default=[1, 16])
    ap.add_argument("--lora-ranks", type=int, nargs="*", default=[8])
    ap.add_argument("--kinds", nargs="*", default=list(KINDS))
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=1800)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--learn-kinds", nargs=2, default=["lora", "lowrank"])
    ap.add_argument("--config", default="arithmetic", help="'arithmetic', 'demo' or a config file's path")
    ap.add_argument("--sigma", type=float, default=1e-2, help="LoRA runs' σ (the adapter's scale differs)")
    ap.add_argument("--lr", type=float, default=5e-3, help="LoRA runs' lr")
    ap.add_argument("--workdir")
    args = ap.parse_args()
    if args.what == "_generation":
        args.new_tokens = min(args.new_tokens, 16)
        one_generation(args)
    else:
        {"speed": speed, "memory": memory, "learn": learn}[args.what](args)


if __name__ == "__main__":
    main()
