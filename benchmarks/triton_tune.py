"""Sweep the Triton kernels' block sizes and warps on this GPU, against its copy bandwidth.

Every kernel is a pure function of (key, element index), so a block size can change the
speed but never a bit: each configuration's output is checked bit for bit against the
shipped configuration's, and a difference fails the sweep.

    python benchmarks/triton_tune.py [--numel 5e8] [--members 30]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from seedledger.ledger.records import ReplayStep  # noqa: E402
from seedledger.replay import _triton_kernels as k  # noqa: E402
from seedledger.replay import noise, update  # noqa: E402


def best(fn, repeat: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return min(times)


class launch:
    """Temporarily set the module's launch constants (restored on exit)."""

    def __init__(self, **values):
        self.values = values

    def __enter__(self):
        self.saved = {name: getattr(k, name) for name in self.values}
        for name, value in self.values.items():
            setattr(k, name, value)

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            setattr(k, name, value)


def copy_time(numel: int) -> float:
    src = torch.zeros(numel, device="cuda")
    dst = torch.empty_like(src)
    return best(lambda: dst.copy_(src))


def sweep_generate(numel: int, t_copy: float) -> None:
    out = torch.empty(numel, device="cuda")
    noise.generate(5, numel, device="cuda", out=out)
    ref = out.clone()
    print(f"\ngenerate {numel / 1e9:.2f}B into out= "
          f"(shipped GEN_GROUPS={k.GEN_GROUPS}, warps={k._GEN_LAUNCH['num_warps']})")
    for groups in (512, 1024, 2048, 4096, 8192):
        for warps in (4, 8, 16):
            with launch(GEN_GROUPS=groups, _GEN_LAUNCH={**k._GEN_LAUNCH, "num_warps": warps}):
                out.zero_()
                t = best(lambda: noise.generate(5, numel, device="cuda", out=out))  # noqa: B023
                same = torch.equal(out.view(torch.int32), ref.view(torch.int32))
            print(f"  groups {groups:5d} warps {warps}: {t * 1e3:7.2f} ms  {numel / t / 1e9:6.1f} G values/s  "
                  f"{4 * numel / t / 1e9:6.0f} GB/s written  ({t / t_copy:.2f}x one copy)"
                  f"{'' if same else '  BITS DIFFER'}")
            if not same:
                raise SystemExit("a block size changed the noise")


def sweep_apply(numel: int, members: int, t_copy: float) -> None:
    keys = [noise.member_key(1, 1, i) for i in range(members)]
    coefs = [noise.round_coefficient(1e-3 * (i + 1)) for i in range(members)]
    start = noise.generate(9, numel, device="cuda")
    for name, opt in (("sgd", {"name": "sgd"}), ("adam", {"name": "adam", "lr": 1e-3})):
        step = ReplayStep("tune", 1, keys, coefs, noise.round_coefficient(1e-3), opt)
        master = {"w": start.clone()}
        update.apply_step(master, update.OptimizerState(), step)
        ref = master["w"].clone()
        print(f"\napply {name} N={members} on {numel / 1e9:.2f}B (shipped APPLY_GROUPS={k.APPLY_GROUPS})")
        for groups in (256, 1024, 2048):
            for warps in (4, 8):
                with launch(APPLY_GROUPS=groups, _LAUNCH={**k._LAUNCH, "num_warps": warps}):
                    master["w"].copy_(start)
                    update.apply_step(master, update.OptimizerState(), step)
                    same = torch.equal(master["w"].view(torch.int32), ref.view(torch.int32))
                    state = update.OptimizerState()
                    update.apply_step(master, state, step)  # allocates the state once
                    t = best(lambda: update.apply_step(master, state, step))  # noqa: B023
                print(f"  groups {groups:5d} warps {warps}: {t * 1e3:8.2f} ms = {t / t_copy:5.2f}x one copy; "
                      f"{numel * members / t / 1e9:6.1f} G member-elements/s{'' if same else '  BITS DIFFER'}")
                if not same:
                    raise SystemExit("a block size changed the update")


def sweep_lowrank(members: int, rank: int) -> None:
    """A SmolLM2-135M-shaped set of 30 layers' linears, the low-rank update's tiles."""
    shapes = {"q_proj": (576, 576), "k_proj": (192, 576), "v_proj": (192, 576), "o_proj": (576, 576),
              "gate_proj": (1536, 576), "up_proj": (1536, 576), "down_proj": (576, 1536)}
    start = {f"l{i}.{n}.weight": noise.generate(i * 10 + j, r * c, device="cuda").view(r, c)
             for i in range(30) for j, (n, (r, c)) in enumerate(shapes.items())}
    numel = sum(v.numel() for v in start.values())
    keys = [noise.member_key(3, 1, i) for i in range(members)]
    coefs = [noise.round_coefficient(1e-3 * (i + 1)) for i in range(members)]
    targets = "suffix:" + ",".join(shapes)
    step = ReplayStep("tune", 1, keys, coefs, 0.001, {"name": "sgd"}, f"lowrank-v1:r={rank}", targets)
    master = {n: v.clone() for n, v in start.items()}
    update.apply_step(master, update.OptimizerState(), step)
    ref = {n: v.clone() for n, v in master.items()}
    print(f"\nlow-rank sgd update, r={rank}, N={members}, {numel / 1e6:.0f}M elements in 210 tensors "
          f"(shipped tile {k.LOWRANK_TILE})")
    for tile in ((16, 64), (32, 64), (64, 64), (128, 64), (128, 128)):
        for warps in (4, 8):
            with launch(LOWRANK_TILE=tile, _LAUNCH={**k._LAUNCH, "num_warps": warps}):
                for n, v in master.items():
                    v.copy_(start[n])
                update.apply_step(master, update.OptimizerState(), step)
                same = all(torch.equal(master[n].view(torch.int32), ref[n].view(torch.int32)) for n in master)
                state = update.OptimizerState()
                t = best(lambda: update.apply_step(master, state, step), repeat=5)  # noqa: B023
            print(f"  tile {tile} warps {warps}: {t * 1e3:7.2f} ms{'' if same else '  BITS DIFFER'}")
            if not same:
                raise SystemExit("a tile changed the low-rank update")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=float, default=5e8)
    ap.add_argument("--members", type=int, default=30)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--skip", nargs="*", default=[], choices=["generate", "apply", "lowrank"])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    numel = int(args.numel)
    t_copy = copy_time(numel)
    print(f"{torch.cuda.get_device_name()}: copy of {numel / 1e9:.2f}B fp32 {t_copy * 1e3:.2f} ms "
          f"({8 * numel / t_copy / 1e9:.0f} GB/s read+write)")
    if "generate" not in args.skip:
        sweep_generate(numel, t_copy)
    if "apply" not in args.skip:
        sweep_apply(numel, args.members, t_copy)
    if "lowrank" not in args.skip:
        sweep_lowrank(args.members, args.rank)


if __name__ == "__main__":
    main()
