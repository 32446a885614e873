"""The Triton kernel checks of tests/test_triton_kernels.py, run in Triton's interpreter:

    TRITON_INTERPRET=1 SEEDLEDGER_REPLAY_IMPL=triton python -m tests.support.triton_checks [CHECK ...]

prints `ok CHECK` or `FAIL CHECK` and the traceback for each, all checks by default.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback

import numpy as np
import torch

from seedledger.ledger.records import ReplayStep
from seedledger.replay import _reference as ref
from seedledger.replay import noise, update
from tests.support.replay_cases import reference_apply, special_values

SKIP = "skip: triton does not import"
CHECKS = ["dispatch", "generate", "generate_random", "perturb", "apply", "apply_large", "apply_random_shapes",
          "kernel_skips_zero_members", "zero_update", "paths_mix", "lowrank_factors", "lowrank_apply",
          "lowrank_zero"]
KEYS = [0, 1, 12345, 2**63, 2**64 - 1, 11429185064331606389]
OPTS = {
    "sgd": {"name": "sgd"},
    "momentum": {"name": "momentum", "lr": 0.01, "beta": 0.9, "dampening": 0.9},
    "adam": {"name": "adam", "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
}


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


@contextlib.contextmanager
def no_reference():
    """Make any use of the torch reference fail: proves the Triton path ran."""
    saved = {n: getattr(ref, n) for n in ("noise_ref", "delta_ref", "apply_rule_ref", "lowrank_delta_ref")}

    def boom(*a, **k):
        raise AssertionError("the torch reference ran instead of the Triton kernel")

    for n in saved:
        setattr(ref, n, boom)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(ref, n, f)


def check_dispatch():
    from seedledger.replay import _backend

    assert _backend.impl() == "triton" and not _backend.fast_cpu()
    assert noise._use_triton(torch.device("cpu")) and not noise._use_fast(torch.device("cpu"))
    assert _backend.use_triton("cuda")
    os.environ["SEEDLEDGER_REPLAY_IMPL"] = "fast"
    _backend.use_triton.cache_clear()  # read once per process, like fast_cpu
    assert _backend.use_triton("cuda") and not _backend.use_triton("cpu")
    os.environ["SEEDLEDGER_REPLAY_IMPL"] = "reference"
    _backend.use_triton.cache_clear()  # read once per process, like fast_cpu
    assert not _backend.use_triton("cuda")
    os.environ["SEEDLEDGER_REPLAY_IMPL"] = "triton"
    _backend.use_triton.cache_clear()  # read once per process, like fast_cpu


def _small_launches() -> None:
    """Launch shapes smaller than the shipped ones (tuned for a GPU: 16,384-element programs,
    128×128 tiles), so that the cases below cross program and tile edges; a launch shape
    changes no bit, each element being a pure function of its index."""
    from seedledger.replay import _triton_kernels as tk

    tk.GEN_GROUPS, tk.LOWRANK_TILE = 512, (32, 64)


def check_generate():
    _small_launches()
    cases = [(0, 0), (1, 0), (1, 3), (2, 1), (3, 2), (4, 0), (5, 7), (2047, 1), (2048, 0), (2049, 2),
             (4097, 4093), (10007, 5), (100_003, 0), (100_003, 6), (5, 2**40 + 1), (9, 2**62 - 3)]
    for key in KEYS:
        for n, offset in cases:
            with no_reference():
                a = noise.generate(key, n, offset=offset)
            assert same(a, ref.noise_ref(key, n, offset)), (key, n, offset)
    # out= and the slicing law
    full = ref.noise_ref(987654321, 20000)
    buf = torch.full((2, 5), 7.0)
    with no_reference():
        assert noise.generate(987654321, 10, offset=4, out=buf) is buf
        for a, b in [(0, 1), (3, 9), (5, 4101), (12345, 20000), (19999, 20000)]:
            assert same(noise.generate(987654321, b - a, offset=a), full[a:b])
    assert same(buf.view(-1), full[4:14])


def check_generate_random():
    _small_launches()
    rng = np.random.default_rng(0)
    for _ in range(25):
        n = int(rng.integers(0, 30000))
        offset = int(rng.integers(0, 1 << 40)) if rng.random() < 0.5 else int(rng.integers(0, 5000))
        key = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))
        with no_reference():
            a = noise.generate(key, n, offset=offset)
        assert same(a, ref.noise_ref(key, n, offset)), (key, n, offset)


def check_perturb():
    _small_launches()
    for n in (0, 1, 3, 2047, 2049, 4099, 70001):
        master = special_values(n, n)
        for scale in (noise.round_coefficient(-1e-3), noise.round_coefficient(2.5e-2), 0.0):
            eps = ref.noise_ref(4242, n)
            expect32 = torch.add(master, torch.mul(eps, scale))
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                out = torch.empty(n, dtype=dtype)
                with no_reference(), np.errstate(over="ignore"):  # huge values → ±inf in fp16
                    noise.perturb_(out, master, 4242, scale)
                assert same(out, expect32.to(dtype)), (n, scale, dtype)
    # a non-contiguous out and a 2-D parameter go through an fp32 buffer / the same kernel
    master = torch.randn(37, 41, generator=torch.Generator().manual_seed(1))
    scale = noise.round_coefficient(1e-3)
    expect = torch.add(master, torch.mul(ref.noise_ref(5, master.numel()).view(master.shape), scale))
    out = torch.empty(41, 37, dtype=torch.bfloat16).t()
    p = torch.nn.Parameter(torch.empty(37, 41))
    with no_reference():
        noise.perturb_(out, master, 5, scale)
        noise.perturb_(p, master, 5, scale)
    assert same(out, expect.to(torch.bfloat16)) and same(p.detach(), expect)


def steps(n: int, population: int, optimizer: dict, seed: int, mirrored: bool) -> list[ReplayStep]:
    """Realistic records: z-scored-looking coefficients; mirrored pairs store 0 for the second."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(1, n + 1):
        keys = [noise.member_key(555, g, i // 2 if mirrored else i) for i in range(population)]
        raw = rng.standard_normal(population) * 10.0 ** rng.uniform(-4, -1)
        if mirrored:
            raw[1::2] = 0.0
        coefs = [noise.round_coefficient(float(x)) for x in raw]
        out.append(ReplayStep("t", g, keys, coefs, noise.round_coefficient(1e-3), dict(optimizer)))
    return out


def compare_apply(shapes: dict, rule: str, mirrored: bool, seed: int, generations: int = 4, population: int = 6):
    fast = {name: special_values(int(np.prod(s)), seed + i).view(s) for i, (name, s) in enumerate(shapes.items())}
    slow = {k: v.clone() for k, v in fast.items()}
    sf, ss = update.OptimizerState(), update.OptimizerState()
    for step in steps(generations, population, OPTS[rule], seed, mirrored):
        with no_reference():
            update.apply_step(fast, sf, step)
        reference_apply(slow, ss, step)
    for name in fast:
        assert same(fast[name], slow[name]), (rule, mirrored, name)
        for kind in update.BUFFERS[rule]:
            assert same(sf.buffers[kind][name], ss.buffers[kind][name]), (rule, kind, name)
    assert sf.step == ss.step == generations


def check_apply():
    shapes = {"zero": (0,), "one": (1,), "odd": (3, 5), "tail": (1025,), "blk": (1024,), "big": (2, 5003),
              "vec": (7,)}
    for rule in OPTS:
        for mirrored in (False, True):
            compare_apply(shapes, rule, mirrored, seed=3, generations=3, population=5)


def check_apply_large():
    """~100k elements. The interpreter pays ~10 ms per program and member, so this case
    uses 16384-element programs (the block size changes no bit: each element is a pure
    function of its index; the other checks use the launch defaults)."""
    from seedledger.replay import _triton_kernels as tk

    tk.APPLY_GROUPS = 4096
    for rule in OPTS:
        compare_apply({"large": (100_003,), "odd": (3, 16411)}, rule, True, seed=4, generations=2, population=6)


def check_apply_random_shapes():
    rng = np.random.default_rng(11)
    for trial in range(6):
        shapes = {}
        for i in range(int(rng.integers(1, 5))):
            dims = int(rng.integers(1, 4))
            high = {1: 20000, 2: 140, 3: 27}[dims]  # at most ~20k elements: the interpreter is slow
            shapes[f"t{i}"] = tuple(int(d) for d in rng.integers(0 if dims == 1 else 1, high, dims))
        rule = list(OPTS)[trial % 3]
        compare_apply(shapes, rule, bool(trial % 2), seed=100 + trial, generations=3,
                      population=int(rng.integers(1, 9)))


def check_kernel_skips_zero_members():
    """The kernel itself skips c == 0 (callers filter too) and starts Δ at −0.0."""
    from seedledger.replay import _triton_kernels as tk

    n = 5000
    keys = [noise.tensor_key(noise.member_key(9, 1, i // 2), "w") for i in range(6)]
    coefs = [noise.round_coefficient(x) for x in (3e-3, 0.0, -2e-3, 0.0, 0.0, 7e-4)]
    for rule, name in enumerate(OPTS):
        theta = special_values(n, 5)
        bufs = [torch.randn(n, generator=torch.Generator().manual_seed(k)).abs() * 1e-4 for k in range(2)]
        bufs = bufs[: len(update.BUFFERS[name])]
        scal = update._scalars(name, OPTS[name], 3)
        t_ref, b_ref = theta.clone(), [b.clone() for b in bufs]
        g = ref.delta_ref(keys, coefs, n, "cpu")
        ref.apply_rule_ref(t_ref, g, rule, scal, *(b_ref + [None, None])[:2])
        tk.apply_many([(theta, bufs)], [keys], [[noise.noise_xkey(k) for k in keys]], coefs, rule, scal)
        assert same(theta, t_ref), name
        assert all(same(a, b) for a, b in zip(bufs, b_ref, strict=True)), name
    # all-zero members straight into the kernel: Δ = −0.0, SGD is the identity
    theta = special_values(n, 6)
    before = theta.clone()
    tk.apply_many([(theta, [])], [keys], [[noise.noise_xkey(k) for k in keys]], [0.0] * 6, 0, [])
    assert same(theta, before)


def check_zero_update():
    """An SGD generation with all-zero coefficients leaves every weight bit-identical."""
    master = {"w": torch.tensor([-0.0, 0.0, 1e-45, -1e-45, 1e-40, -1e-39, 1.0, -2.5, 3e38, -1e-30]),
              "v": special_values(4099, 8)}
    before = {k: v.clone() for k, v in master.items()}
    keys = [noise.member_key(1, 1, i) for i in range(4)]
    with no_reference():
        update.apply_step(master, update.OptimizerState(), ReplayStep("z", 1, keys, [0.0] * 4, 0.001, {"name": "sgd"}))
        update.apply_step(master, update.OptimizerState(), ReplayStep("z", 2, [], [], 0.001, {"name": "sgd"}))
    assert all(same(master[k], before[k]) for k in master)


def check_paths_mix():
    """The `paths` rule's recombining form (a GA's survivor offsets) through the Triton
    kernels equals the torch reference bit for bit, and a generation whose coefficients are
    all zero leaves the master bit-identical (−0.0 included): g sums from −0.0."""
    from seedledger.replay import _backend

    _small_launches()
    keys = [noise.member_key(4, 1, i) for i in range(4)]
    steps = [
        ReplayStep("p", 1, keys, [0.0, 0.0, 0.0, 0.0], 0.125,  # the elite won: nothing moves but the paths
                   {"name": "paths", "move": [0.0, 0.0], "mix": [[0.0, 0.0], [0.0, 0.0]],
                    "noise": [[0.0, -0.125, 0.125, 0.0], [0.0, 0.0, 0.0, 0.125]]}),
        ReplayStep("p", 2, keys, [0.0, 0.125, 0.0, 0.0], 0.125,
                   {"name": "paths", "move": [0.0, 0.0], "mix": [[0.0, 1.0], [0.5, 0.5]],
                    "noise": [[0.0, -0.125, 0.125, 0.0], [0.0, -0.125, 0.0, 0.125]]}),
        ReplayStep("p", 3, keys, [0.0, 0.0, -0.0625, 0.0], 0.125,
                   {"name": "paths", "move": [0.25, 0.75], "mix": [[1.0, -1.0], [0.0, 1.0]],
                    "noise": [[0.0, 0.0, 0.0625, 0.0], [0.0, 0.0, 0.0, 0.0]]}),
    ]

    def fresh() -> dict[str, torch.Tensor]:
        return {"w": special_values(4099, 8), "v": torch.tensor([-0.0, 0.0, 1e-45, -1e-45, 1.0, -2.5])}

    def run() -> list[tuple[dict, dict]]:
        master = fresh()
        state, seen = update.OptimizerState(), []
        for step in steps:
            update.apply_step(master, state, step)
            seen.append(({k: v.clone() for k, v in master.items()},
                         {k: {n: t.clone() for n, t in b.items()} for k, b in state.buffers.items()}))
        return seen

    with no_reference():
        triton_run = run()
    before = fresh()
    assert all(same(triton_run[0][0][k], before[k]) for k in before), "an all-zero generation moved θ"
    os.environ["SEEDLEDGER_REPLAY_IMPL"] = "reference"
    _backend.use_triton.cache_clear()
    _backend.fast_cpu.cache_clear()
    try:
        reference_run = run()
    finally:
        os.environ["SEEDLEDGER_REPLAY_IMPL"] = "triton"
        _backend.use_triton.cache_clear()
        _backend.fast_cpu.cache_clear()
    for (tm, tb), (rm, rb) in zip(triton_run, reference_run, strict=True):
        assert all(same(tm[k], rm[k]) for k in tm)
        assert tb.keys() == rb.keys() and all(same(tb[p][n], rb[p][n]) for p in tb for n in tb[p])


LOWRANK_SHAPES = {"l.q_proj.weight": (1, 1), "l.k_proj.weight": (3, 5), "l.v_proj.weight": (7, 130),
                  "l.o_proj.weight": (0, 4), "l.up_proj.weight": (5, 0), "l.down_proj.weight": (33, 65),
                  "embed.weight": (6, 3), "norm.weight": (4,)}


def check_lowrank_factors():
    from seedledger.replay import perturbation

    keys = [noise.member_key(9, 2, i) for i in range(3)]
    for rank in (1, 4):
        for shape in [(1, 1), (3, 5), (7, 130), (0, 4), (5, 0)]:
            with no_reference():
                a, b = perturbation.stacked_factors(keys, "w", shape, rank)
            for m, k in enumerate(keys):
                ka, kb = perturbation.factor_keys(k, "w")
                assert same(a[m].reshape(-1), ref.noise_ref(ka, shape[0] * rank)), (rank, shape)
                assert same(b[m].reshape(-1), ref.noise_ref(kb, shape[1] * rank)), (rank, shape)


def check_lowrank_apply():
    """Odd shapes (several tiles each way), rank 1 and 4, every rule, mirrored zeros and a
    2**-100 coefficient; frozen tensors untouched; perturb_lowrank_ too."""
    from seedledger.replay import lowrank

    _small_launches()
    for rank in (1, 4):
        for rule in OPTS:
            fast = {n: special_values(int(np.prod(s)), i).view(s) for i, (n, s) in enumerate(LOWRANK_SHAPES.items())}
            slow = {k: v.clone() for k, v in fast.items()}
            sf, ss = update.OptimizerState(), update.OptimizerState()
            for st in steps(2, 4, OPTS[rule], seed=rank, mirrored=True):
                st.coefficients[-2] = 2.0**-100
                st.noise_spec = f"lowrank-v1:r={rank}"
                st.param_selection = "suffix:q_proj,k_proj,v_proj,o_proj,up_proj,down_proj"
                with no_reference():
                    update.apply_step(fast, sf, st)
                reference_apply(slow, ss, st)
            for name in fast:
                assert same(fast[name], slow[name]), (rank, rule, name)
                for kind in update.BUFFERS[rule]:
                    assert set(sf.buffers[kind]) == set(ss.buffers[kind])
                    if name in sf.buffers[kind]:
                        assert same(sf.buffers[kind][name], ss.buffers[kind][name]), (rank, rule, kind, name)
        master = special_values(33 * 65, 9).view(33, 65)
        scale = noise.round_coefficient(-1e-3)
        expect = master.clone()
        lowrank.apply([("w", expect, [])], [77], [scale], 0, [], rank, reference=True)
        for dtype in (torch.float32, torch.bfloat16):
            out = torch.empty(33, 65, dtype=dtype)
            with no_reference():
                lowrank.perturb_lowrank_(out, master, 77, "w", scale, rank)
            assert same(out, expect.to(dtype)), (rank, dtype)


def check_lowrank_zero():
    """All-zero low-rank generations leave every weight bit-identical; the kernel itself
    skips s == 0 (−0.0 + (+0.0) would turn a −0.0 weight into +0.0)."""
    from seedledger.replay import _triton_kernels as tk
    from seedledger.replay import perturbation

    master = {"a.q_proj.weight": torch.tensor([[-0.0, 0.0, 1e-45], [-1e-45, 1e-40, -1e-39]]),
              "b.v_proj.weight": special_values(40 * 70, 8).view(40, 70)}
    before = {k: v.clone() for k, v in master.items()}
    keys = [noise.member_key(1, 1, i) for i in range(4)]
    with no_reference():
        update.apply_step(master, update.OptimizerState(),
                          ReplayStep("z", 1, keys, [0.0] * 4, 0.001, {"name": "sgd"}, "lowrank-v1:r=4",
                                     "suffix:q_proj,v_proj"))
        items = [(t, []) for t in master.values()]
        tk.lowrank_apply_many(items, torch.from_numpy(perturbation.key_table(keys, list(master)).view(np.int64)),
                              [0.0] * 4, 4, 0, [])
    assert all(same(master[k], before[k]) for k in master)


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("SEEDLEDGER_REPLAY_IMPL") != "triton":
        sys.exit("run with TRITON_INTERPRET=1 SEEDLEDGER_REPLAY_IMPL=triton")
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(f"{SKIP} ({exc!r})")
        sys.exit(0)
    for name in sys.argv[1:] or CHECKS:
        try:
            globals()[f"check_{name}"]()
        except Exception:  # noqa: BLE001  (each check reports on its own line)
            print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
        else:
            print(f"ok {name}", flush=True)
