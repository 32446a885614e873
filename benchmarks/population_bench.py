"""One ES generation's evaluation three ways, in one run, on the same rows.

    (a) per-member: each member's full-rank weights loaded, then its prompts decoded
        (batch = prompts): the path every full-rank run takes;
    (b) batched low-rank: the master loaded once, `members_per_forward` members' rows
        decoded together with each row's rank-r term (engine/runtime/backends/hf_lowrank.py);
    (c) pure batched inference of the unperturbed model over the same rows and chunks:
        the limit (b) can reach.

`--kv-cache dynamic static` times (b) and (c) with each KV cache (transformers' default,
dynamic, and `sampling.kv_cache: static`, which on CUDA compiles the decode step into CUDA
graphs; the warm-up pays the compilation) and prints the static pure path against HF
`generate`'s default, the dynamic pure path, on the same rows, with the share of rows whose
greedy completion differs between the caches.

Figures: generated tokens/s (up to each row's EOS) and row-steps/s (rows × decode steps
of each `generate` call: the work done, since finished rows ride along), and (b)/(c),
(b)/(a). `--faithfulness` also compares (b) with each member's materialised weights
`cast(W + σ·A·Bᵀ/√r)`: the largest logit difference and the share of identical greedy
completions.

    .venv/bin/python benchmarks/population_bench.py [--members 8 32] [--prompts 16]
        [--new-tokens 64] [--rank 1] [--group 8] [--device cpu|cuda] [--model ...]
        [--dtype float32|bfloat16|float16] [--kv-cache dynamic static] [--faithfulness] [--vllm]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from benchmarks.population_common import QUESTIONS, members  # noqa: E402
from seedledger.engine.runtime.backends.hf import HFBackend  # noqa: E402
from seedledger.engine.runtime.models.resolve import resolve_model  # noqa: E402
from seedledger.replay import noise  # noqa: E402
from seedledger.replay.perturbation import Perturbation, factors  # noqa: E402

SIGMA = noise.round_coefficient(1e-3)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _steps(ids: list[list[int]], chunk: int, new: int) -> int:
    """rows × decode steps summed over the `generate` calls of `chunk` rows each."""
    total = 0
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        total += len(part) * min(new, max((len(r) for r in part), default=0))
    return total


def per_member(model_dir, device, dtype, n, prompts, new) -> dict:
    backend = HFBackend(model_dir, device=device, dtype=dtype, batch_size=len(prompts))
    master = backend.master()
    keys, signs = members(n)
    backend.generate_ids(prompts, 2)  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    ids = []
    for key, sign in zip(keys, signs, strict=True):
        backend.load_member(master, key, sign, SIGMA)
        ids += backend.generate_ids(prompts, new)
    _sync(device)
    return _figures("(a) per-member", ids, time.perf_counter() - t0, len(prompts), new)


def batched(model_dir, device, dtype, n, prompts, new, rank, group, unperturbed: bool, cache: str = "dynamic") -> dict:
    p = Perturbation.lowrank(rank)
    backend = HFBackend(model_dir, device=device, dtype=dtype, perturbation=p, kv_cache=cache)
    master = backend.master()
    backend.load_master(master)
    keys, signs = members(n)
    chunk = group * len(prompts)
    # Warm-up over the timed shapes: on CUDA, cuDNN builds an attention plan per new sequence
    # length (~0.1 s each) into a process-wide cache, which would otherwise bill whichever
    # path runs first for both.
    warm = [q for _ in keys[:group] for q in prompts]
    with contextlib.nullcontext() if unperturbed else backend.members(master, keys[:group], signs[:group], SIGMA):
        backend._decode(warm, [None] * len(warm), new, batch=chunk)
    _sync(device)
    t0 = time.perf_counter()
    ids = []
    for start in range(0, n, group):
        rows = [q for _ in keys[start : start + group] for q in prompts]
        if unperturbed:
            ids += backend._decode(rows, [None] * len(rows), new, batch=chunk)
            continue
        with backend.members(master, keys[start : start + group], signs[start : start + group], SIGMA):
            ids += backend._decode(rows, [None] * len(rows), new, batch=chunk)
    _sync(device)
    label = "(c) pure inference" if unperturbed else f"(b) batched low-rank r={rank}"
    return {**_figures(f"{label} {cache}", ids, time.perf_counter() - t0, chunk, new), "ids": ids}


def _figures(label: str, ids: list[list[int]], seconds: float, chunk: int, new: int) -> dict:
    produced = sum(len(r) for r in ids)
    return {
        "path": label,
        "rows": len(ids),
        "seconds": seconds,
        "tokens_per_s": produced / seconds,
        "row_steps_per_s": _steps(ids, chunk, new) / seconds,
    }


def faithfulness(model_dir, device, dtype, n, prompts, new, rank) -> dict:
    """(b) against each member's materialised weights: logits and greedy completions."""
    p = Perturbation.lowrank(rank)
    batched_b = HFBackend(model_dir, device=device, dtype=dtype, perturbation=p)
    plain = HFBackend(model_dir, device=device, dtype=dtype, batch_size=len(prompts))
    master = batched_b.master()
    batched_b.load_master(master)
    keys, signs = members(n)
    worst, same, total = 0.0, 0, 0
    for key, sign in zip(keys, signs, strict=True):
        with torch.no_grad():
            for name, param in plain._params.items():
                w = master[name]
                if p.trained(name, tuple(w.shape)):
                    a, b = factors(key, name, tuple(w.shape), rank, device=w.device)
                    w = w + (sign * SIGMA * p.inv_sqrt_rank) * (a @ b.T)
                param.copy_(w)
        enc = plain._encode(prompts)
        with torch.inference_mode():
            ref = plain.model(**enc).logits
            with batched_b.members(master, [key], [sign], SIGMA):
                got = batched_b.model(**enc).logits
                mine = batched_b._decode(prompts, [None] * len(prompts), new, batch=len(prompts))
        worst = max(worst, (ref - got).abs().max().item())
        theirs = plain.generate_ids(prompts, new)
        same += sum(a == b for a, b in zip(mine, theirs, strict=True))
        total += len(prompts)
    return {"members": n, "max_logit_diff": worst, "identical_completions": same / total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--members", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--group", type=int, default=None,
                    help="members per forward (default: engine.runtime.setup.batching's row cap for the device)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--kv-cache", nargs="+", default=["dynamic"], choices=["dynamic", "static"],
                    help="time (b) and (c) with each KV cache")
    ap.add_argument("--faithfulness", action="store_true")
    ap.add_argument("--skip-per-member", action="store_true")
    ap.add_argument("--vllm", action="store_true", help="also the vLLM section (population_bench_vllm.py)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    dtype = getattr(torch, args.dtype)
    prompts = [[{"role": "user", "content": q}] for q in (QUESTIONS * (args.prompts // 16 + 1))[: args.prompts]]
    print(f"model {args.model}, device {args.device}, {torch.get_num_threads()} threads, "
          f"{args.dtype}, {args.prompts} prompts, {args.new_tokens} new tokens, rank {args.rank}")
    from seedledger.engine.runtime.setup.batching import CPU_ROWS, CUDA_MAX_ROWS

    rows_cap = CUDA_MAX_ROWS if args.device.startswith("cuda") else CPU_ROWS
    for n in args.members:
        group = args.group or max(1, min(n, rows_cap // args.prompts))
        print(f"\nN = {n} members, {group} per forward ({group * args.prompts} rows)")
        rows = []
        if not args.skip_per_member:
            rows.append(per_member(model_dir, args.device, dtype, n, prompts, args.new_tokens))
            a = rows[0]
            print(f"  {a['path']:36} {a['seconds']:8.1f} s  {a['tokens_per_s']:8.1f} tok/s  "
                  f"{a['row_steps_per_s']:8.1f} row-steps/s")
        pure, terms = {}, {}
        for cache in args.kv_cache:
            b = terms[cache] = batched(model_dir, args.device, dtype, n, prompts, args.new_tokens, args.rank, group,
                                       False, cache)
            c = pure[cache] = batched(model_dir, args.device, dtype, n, prompts, args.new_tokens, args.rank, group,
                                      True, cache)
            rows += [b, c]
            for r in (b, c):
                print(f"  {r['path']:36} {r['seconds']:8.1f} s  {r['tokens_per_s']:8.1f} tok/s  "
                      f"{r['row_steps_per_s']:8.1f} row-steps/s")
            print(f"  (b)/(c) {cache}: {b['row_steps_per_s'] / c['row_steps_per_s']:.2f} (row-steps/s), "
                  f"{b['tokens_per_s'] / c['tokens_per_s']:.2f} (tok/s)")
        if len(pure) == 2:
            for label, by_cache in (("(b)", terms), ("(c) [dynamic: HF generate's default]", pure)):
                dyn, stat = by_cache["dynamic"], by_cache["static"]
                differ = sum(x != y for x, y in zip(dyn["ids"], stat["ids"], strict=True))
                print(f"  {label} static / dynamic: {stat['tokens_per_s'] / dyn['tokens_per_s']:.2f} (tok/s); "
                      f"greedy completions differing: {differ} of {len(dyn['ids'])} rows")
        if not args.skip_per_member:
            print(f"  (b)/(a): {b['seconds'] and a['seconds'] / b['seconds']:.2f}× faster per generation "
                  f"({b['path']})")
        if args.faithfulness:
            f = faithfulness(model_dir, args.device, dtype, min(n, 8), prompts, args.new_tokens, args.rank)
            print(f"  faithfulness over {f['members']} members: max |Δlogit| {f['max_logit_diff']:.2e}, "
                  f"identical greedy completions {f['identical_completions']:.1%}")
        if args.vllm:
            from benchmarks.population_bench_vllm import vllm_section

            vllm_section(model_dir, n, prompts, args.new_tokens)


if __name__ == "__main__":
    main()
