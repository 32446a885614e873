"""Replay benchmarks (issues 4, 12): noise throughput, fused apply cost, low-rank vs full-rank
update, rebuild vs loading weights.

    .venv/bin/python benchmarks/replay_bench.py [--generations 100] [--population 8]
    .venv/bin/python benchmarks/replay_bench.py --lowrank-only [--device cuda]
    .venv/bin/python benchmarks/replay_bench.py --cuda-only [--cuda-numel 5e8] [--cuda-reference]

Every ratio is measured within one run (best of --repeat), so machine load affects both
sides; absolute times on a shared machine are not comparable between runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seedledger.ledger import GenerationRecord, Ledger, MemberRecord, ReplayStep  # noqa: E402
from seedledger.replay import noise, update  # noqa: E402
from seedledger.replay.fingerprint import fingerprint  # noqa: E402
from seedledger.replay.rebuild import rebuild  # noqa: E402

SMOLLM2 = Path(os.environ.get("SEEDLEDGER_HOME", Path.home() / ".cache/seedledger")) / "models/smollm2-135m-instruct"


def best(fn: Callable[[], object], repeat: int, sync: bool = False) -> float:
    times = []
    for _ in range(repeat):
        if sync:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_noise(n: int, repeat: int) -> float:
    gen = torch.Generator().manual_seed(0)
    noise.generate(1, 1 << 20), torch.randn(1 << 20, generator=gen)  # warm-up (numba cache load)
    t_randn = best(lambda: torch.randn(n, generator=gen), repeat)
    t_noise = best(lambda: noise.generate(123, n), repeat)
    print(f"noise {n:.0e} fp32, fresh tensor: replay.noise.generate {t_noise:.3f}s ({n / t_noise / 1e9:.2f} G/s), "
          f"torch.randn(generator) {t_randn:.3f}s -> ratio {t_randn / t_noise:.2f}x (need >= 2, target 3)")
    buf = torch.empty(n)
    buf.zero_()  # fault the pages in once: compares generators, not the allocator
    t_randn = best(lambda: torch.randn(n, generator=gen, out=buf), repeat)
    t_noise = best(lambda: noise.generate(123, n, out=buf), repeat)
    print(f"noise {n:.0e} fp32, into out=: replay.noise.generate {t_noise:.3f}s ({n / t_noise / 1e9:.2f} G/s), "
          f"torch.randn(generator) {t_randn:.3f}s -> ratio {t_randn / t_noise:.2f}x")
    return t_noise


def bench_apply(n: int, repeat: int) -> None:
    theta, buf = torch.zeros(n), torch.zeros(n)
    # the stricter denominator: one noise generation into an existing buffer (no page faults)
    t_noise = best(lambda: noise.generate(7, n, out=buf), repeat)
    for pop in (8, 30):
        keys = [noise.member_key(1, 1, i) for i in range(pop)]
        coefs = [noise.round_coefficient(1e-3 * (i + 1)) for i in range(pop)]
        t = best(lambda: update.apply_tensor(theta, keys, coefs, 0, [], []), repeat)  # noqa: B023
        print(f"apply N={pop:2d} on {n:.0e}: {t:.3f}s; "
              f"/ (N x noise {t_noise:.3f}s) = {t / (pop * t_noise):.2f} (need <= 1)")


def linear_master(layers: int, device: str) -> dict[str, torch.Tensor]:
    """SmolLM2-135M's linear layers (q, k, v, o, gate, up, down), ``layers`` of them: 6 give 2.1e7 weights."""
    h, inter, kv = 576, 1536, 192
    shapes = {"self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
              "self_attn.o_proj": (h, h), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
              "mlp.down_proj": (h, inter)}
    return {
        f"model.layers.{i}.{n}.weight": torch.zeros(s, device=device) for i in range(layers) for n, s in shapes.items()
    }


def bench_lowrank(repeat: int, device: str, layers: int = 6) -> None:
    """One generation's exact update, low-rank (r = 1, 4, 16) vs full-rank, same tensors and N."""
    from seedledger.replay.perturbation import Perturbation

    master = linear_master(layers, device)
    numel = sum(t.numel() for t in master.values())
    sync = device == "cuda"
    print(f"low-rank vs full-rank update ({device}): {numel / 1e6:.1f}M weights in {len(master)} SmolLM2 linear "
          f"tensors, SGD, best of {repeat}")
    for pop in (8, 30):
        keys = [noise.member_key(1, 1, i) for i in range(pop)]
        coefs = [noise.round_coefficient(1e-3 * (i + 1)) for i in range(pop)]
        state = update.OptimizerState()
        times = {}
        for kind in (Perturbation(), *(Perturbation.lowrank(r) for r in (1, 4, 16))):
            step = ReplayStep("bench", 1, keys, coefs, 1e-3, {"name": "sgd"}, kind.noise_spec, kind.param_selection)
            update.apply_step(master, state, step)  # compile / warm-up
            times[kind.rank] = best(lambda: update.apply_step(master, state, step), repeat, sync=sync)  # noqa: B023
        full = times.pop(0)
        print(f"  N={pop:2d}: full {full:.3f}s; " + ", ".join(
            f"r={r} {t:.3f}s ({t / full:.2f}x full)" for r, t in times.items()))


def smollm2_master() -> tuple[dict[str, torch.Tensor], str]:
    """The provisioned SmolLM2-135M weights, or random tensors of its shapes."""
    path = SMOLLM2 / "model.safetensors"
    if path.exists():
        from safetensors.torch import load_file

        return {k: v.float().contiguous() for k, v in load_file(str(path)).items()}, str(path)
    g = torch.Generator().manual_seed(0)
    h, inter, kv, layers = 576, 1536, 192, 30
    shapes = {"model.embed_tokens.weight": (49152, h), "model.norm.weight": (h,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                   p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                   p + "mlp.down_proj.weight": (h, inter), p + "input_layernorm.weight": (h,),
                   p + "post_attention_layernorm.weight": (h,)}
    return {k: torch.randn(s, generator=g) * 0.02 for k, s in shapes.items()}, "synthetic (SmolLM2-135M shapes)"


def bench_rebuild(generations: int, pop: int, repeat: int) -> None:
    from safetensors.torch import load_file, save_file

    master, source = smollm2_master()
    numel = sum(t.numel() for t in master.values())
    print(f"rebuild: master {numel / 1e6:.1f}M fp32 parameters in {len(master)} tensors from {source}")
    with tempfile.TemporaryDirectory() as tmp:
        led = Ledger.open(str(Path(tmp) / "bench.db"))
        t = time.perf_counter()
        base_fp = fingerprint(master)
        t_fp = time.perf_counter() - t
        run = led.create_run("bench", base_model="smollm2-135m-instruct", base_fingerprint=base_fp,
                             noise_spec=noise.NOISE_SPEC, seed=0, run_key=noise.run_key(0))
        gen = torch.Generator().manual_seed(0)
        for g in range(1, generations + 1):
            coefs = [noise.round_coefficient(x) for x in (torch.randn(pop, generator=gen) * 1e-4).tolist()]
            members = [MemberRecord(i, noise.member_key(run.run_key, g, i), 1, 0.0, c) for i, c in enumerate(coefs)]
            led.commit_generation("bench", GenerationRecord(g, 1e-3, noise.round_coefficient(1e-3), pop,
                                                            {"name": "sgd"}, g, [], members, None))
        t = time.perf_counter()
        out, _ = rebuild(led, "bench", generations, master, verify="none")
        t_rebuild = time.perf_counter() - t
        print(f"rebuild {generations} generations x N={pop}: {t_rebuild:.1f}s "
              f"({t_rebuild / generations:.2f}s per generation, incl. one base fingerprint {t_fp:.2f}s)")
        path = Path(tmp) / "model.safetensors"
        save_file(out, str(path))
        size = path.stat().st_size / 2**20
        t_load = best(lambda: load_file(str(path)), repeat)
        t_touch = best(lambda: [t.clone() for t in load_file(str(path)).values()], repeat)
        print(f"load the same {size:.0f} MiB safetensors (page cache warm): load_file {t_load:.2f}s "
              f"(may map lazily), load_file + copy every tensor {t_touch:.2f}s "
              f"-> rebuild / load = {t_rebuild / t_load:.0f}x / {t_rebuild / t_touch:.0f}x; "
              f"per generation / load+copy = {t_rebuild / generations / t_touch:.1f}x")
        led.close()


def bench_cuda(numel: int, repeat: int, reference: bool) -> None:
    """The CUDA path (Triton kernels when triton imports) against the copy bandwidth.

    A copy of n fp32 reads 4n and writes 4n bytes; SGD's fused update moves the same
    bytes (master read + write), momentum 2x and Adam 3x, so t / t_copy near those
    figures means no extra memory passes.
    """
    if not torch.cuda.is_available():
        print("cuda: not available, skipped")
        return
    from seedledger.replay import _backend

    path = "Triton kernels" if _backend.use_triton("cuda") else "torch reference (no Triton)"
    print(f"cuda {torch.cuda.get_device_name()}: {numel / 1e9:.2f}B fp32 elements, path: {path}")
    src = torch.zeros(numel, device="cuda")
    dst = torch.empty_like(src)
    t_copy = best(lambda: dst.copy_(src), repeat, sync=True)
    gbps = 2 * 4 * numel / t_copy / 1e9
    print(f"  device copy: {t_copy * 1e3:.2f} ms ({gbps:.0f} GB/s read+write)")
    noise.generate(1, 1 << 20, device="cuda")  # compile / warm-up
    t_noise = best(lambda: noise.generate(5, numel, device="cuda"), repeat, sync=True)
    t_noise_out = best(lambda: noise.generate(5, numel, device="cuda", out=dst), repeat, sync=True)
    print(f"  noise fresh tensor: {t_noise * 1e3:.2f} ms ({numel / t_noise / 1e9:.1f} G values/s); "
          f"into out=: {t_noise_out * 1e3:.2f} ms ({numel / t_noise_out / 1e9:.1f} G values/s, "
          f"{4 * numel / t_noise_out / 1e9:.0f} GB/s written, {t_noise_out / t_copy:.2f}x one copy)")
    out16 = torch.empty(numel, dtype=torch.bfloat16, device="cuda")
    scale = noise.round_coefficient(1e-3)
    noise.perturb_(out16[: 1 << 20], src[: 1 << 20], 3, scale)
    t_pert = best(lambda: noise.perturb_(out16, src, 3, scale), repeat, sync=True)
    print(f"  perturb_ into bf16: {t_pert * 1e3:.2f} ms ({t_pert / t_copy:.2f}x one fp32 copy; moves 0.75x its bytes)")
    master = {"w": torch.zeros(numel, device="cuda")}
    for name, opt, passes in [("sgd", {"name": "sgd"}, 1), ("momentum", {"name": "momentum", "lr": 1e-3}, 2),
                              ("adam", {"name": "adam", "lr": 1e-3}, 3)]:
        for pop in (8, 30):
            keys = [noise.member_key(1, 1, i) for i in range(pop)]
            coefs = [noise.round_coefficient(1e-3 * (i + 1)) for i in range(pop)]
            step = ReplayStep("bench", 1, keys, coefs, scale, opt)
            state = update.OptimizerState()
            update.apply_step(master, state, step)  # compile / warm-up, allocates state
            t_apply = best(lambda: update.apply_step(master, state, step), repeat, sync=True)  # noqa: B023
            print(f"  apply {name:8s} N={pop:2d}: {t_apply * 1e3:8.2f} ms = {t_apply / t_copy:5.1f}x one copy "
                  f"(memory floor {passes}x); / (N x noise into out=) = {t_apply / (pop * t_noise_out):.2f}")
    if reference:
        keys = [noise.member_key(1, 1, i) for i in range(8)]
        coefs = [noise.round_coefficient(1e-3 * (i + 1)) for i in range(8)]
        tkeys = [noise.tensor_key(k, "w") for k in keys]
        t_ref = best(lambda: update.apply_tensor(master["w"], tkeys, coefs, 0, [], [], fast=False), 1, sync=True)
        print(f"  torch reference apply sgd N= 8: {t_ref * 1e3:.1f} ms ({t_ref / t_copy:.0f}x one copy)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--noise-numel", type=float, default=1e8)
    ap.add_argument("--apply-numel", type=float, default=2e7)
    ap.add_argument("--generations", type=int, default=100)
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--cuda-numel", type=float, default=5e8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-rebuild", action="store_true")
    ap.add_argument("--cuda-only", action="store_true", help="only the CUDA section")
    ap.add_argument("--cuda-reference", action="store_true", help="also time the torch reference update on CUDA")
    ap.add_argument("--lowrank-only", action="store_true", help="only the low-rank vs full-rank update")
    ap.add_argument("--device", default="cpu", help="device of the low-rank comparison (cpu or cuda)")
    args = ap.parse_args()
    import numba

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, numba {numba.__version__} ({numba.get_num_threads()} threads), "
          f"{os.cpu_count()} CPUs, load average {load:.1f}")
    if args.lowrank_only:
        bench_lowrank(args.repeat, args.device)
        return
    if not args.cuda_only:
        bench_noise(int(args.noise_numel), args.repeat)
        bench_apply(int(args.apply_numel), args.repeat)
        bench_lowrank(args.repeat, "cpu")
        if not args.skip_rebuild:
            bench_rebuild(args.generations, args.population, args.repeat)
    bench_cuda(int(args.cuda_numel), args.repeat, args.cuda_reference)
    if torch.cuda.is_available():
        bench_lowrank(args.repeat, "cuda", layers=30)


if __name__ == "__main__":
    main()
