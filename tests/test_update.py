"""Exact updates: the numba path equals the torch reference bit for bit, for every rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.records import GenerationRecord, MemberRecord, ReplayStep
from seedledger.replay import _reference as ref
from seedledger.replay import noise, update
from seedledger.replay.table import TABLE_NP
from tests.support.replay_cases import reference_apply

OPTS = {
    "sgd": {"name": "sgd"},
    "momentum": {"name": "momentum", "lr": 0.01, "beta": 0.9, "dampening": 0.9},
    "adam": {"name": "adam", "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
}
SHAPES = {"zero": (0,), "one": (1,), "odd": (3, 5), "tail": (4097,), "big": (2, 10007), "vec": (7,)}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def make_master(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in SHAPES.items()}


def steps(n: int, population: int, optimizer: dict, seed: int = 1, mirrored: bool = False,
          zero_second: bool = False) -> list[ReplayStep]:
    """Records; mirrored pairs share a key, and with zero_second store 0 for the second member."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(1, n + 1):
        keys = [noise.member_key(555, g, i // 2 if mirrored else i) for i in range(population)]
        raw = rng.standard_normal(population) * 0.01
        if zero_second:
            raw[1::2] = 0.0
        coefs = [noise.round_coefficient(float(x)) for x in raw]
        out.append(ReplayStep("t", g, keys, coefs, noise.round_coefficient(1e-3), dict(optimizer)))
    return out


@pytest.mark.parametrize("mirrored", ["distinct", "mirrored", "mirrored-zero"])
@pytest.mark.parametrize("rule", list(OPTS))
def test_fast_equals_reference(rule, mirrored):
    fast, slow = make_master(), make_master()
    sf, ss = update.OptimizerState(), update.OptimizerState()
    for step in steps(4, 5, OPTS[rule], mirrored=mirrored != "distinct", zero_second=mirrored == "mirrored-zero"):
        update.apply_step(fast, sf, step)
        reference_apply(slow, ss, step)
    for name in fast:
        assert torch.equal(bits(fast[name]), bits(slow[name])), name
        for kind in update.BUFFERS[rule]:
            assert torch.equal(bits(sf.buffers[kind][name]), bits(ss.buffers[kind][name]))
    assert sf.step == ss.step == 4


def test_sgd_is_the_member_order_fp32_sum():
    """θ + ((0 + c0·ε0) + c1·ε1) + ... computed independently in numpy float32."""
    master = make_master(3)
    expect = {n: t.numpy().copy() for n, t in master.items()}
    (step,) = steps(1, 7, OPTS["sgd"], seed=4)
    update.apply_step(master, update.OptimizerState(), step)
    for name, theta in expect.items():
        delta = np.zeros(theta.size, dtype=np.float32)
        for key, c in zip(step.keys, step.coefficients, strict=True):
            eps = noise.generate(noise.tensor_key(key, name), theta.size).numpy()
            prod = np.float32(c) * eps
            assert np.array_equal(prod.astype(np.float64), c * eps.astype(np.float64))  # exact
            delta = delta + prod
        got = master[name].numpy().reshape(-1).view(np.int32)
        assert np.array_equal((theta.reshape(-1) + delta).view(np.int32), got)


def test_generation_record_and_replay_step_agree():
    (step,) = steps(1, 4, OPTS["momentum"])
    members = [MemberRecord(i, k, 1, 0.0, c) for i, (k, c) in enumerate(zip(step.keys, step.coefficients, strict=True))]
    opt = {k: v for k, v in step.optimizer.items() if k != "lr"}
    rec = GenerationRecord(1, 0.01, step.sigma, 4, opt, 0, [], members, None)
    a, b = make_master(), make_master()
    update.apply_step(a, update.OptimizerState(), step)
    update.apply_step(b, update.OptimizerState(), rec)  # lr taken from the record
    assert all(torch.equal(bits(a[n]), bits(b[n])) for n in a)


def test_bad_records_are_refused():
    master = make_master()
    (step,) = steps(1, 2, OPTS["sgd"])
    bad = ReplayStep("t", 1, step.keys, [0.1, 0.2], 0.001, {"name": "sgd"})  # not rounded
    with pytest.raises(SeedLedgerError, match="significant bits"):
        update.apply_step(master, update.OptimizerState(), bad)
    with pytest.raises(SeedLedgerError, match="unknown optimizer"):
        update.apply_step(master, update.OptimizerState(), ReplayStep("t", 1, [], [], 0.0, {"name": "lion"}))
    with pytest.raises(SeedLedgerError, match="needs lr"):
        update.apply_step(master, update.OptimizerState(), ReplayStep("t", 1, [], [], 0.0, {"name": "adam"}))


def test_rule_switch_restarts_state():
    master, state = make_master(), update.OptimizerState()
    for step in steps(2, 3, OPTS["adam"]):
        update.apply_step(master, state, step)
    assert state.name == "adam" and state.step == 2
    update.apply_step(master, state, steps(1, 3, OPTS["momentum"])[0])
    assert state.name == "momentum" and state.step == 1 and set(state.buffers) == {"momentum"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(0,), (1,), (5, 3), (4099,)])
def test_perturb_builds_from_master(dtype, shape):
    master = torch.randn(shape, generator=torch.Generator().manual_seed(9))
    key, scale = 4242, noise.round_coefficient(-1e-3)
    out = torch.empty(shape, dtype=dtype)
    noise.perturb_(out, master, key, scale)
    eps = ref.noise_ref(key, master.numel()).view(shape)
    expect = torch.add(master, torch.mul(eps, scale)).to(dtype)
    assert torch.equal(out, expect)
    with pytest.raises(ValueError):
        noise.perturb_(out, master, key, 1e-3 + 1e-12)


def test_adam_matches_torch_adam_closely():
    """Sanity of the rule itself: within fp32 noise of torch.optim.Adam (ascent on g)."""
    master = {"w": torch.randn(1000, generator=torch.Generator().manual_seed(0))}
    p = torch.nn.Parameter(master["w"].clone())
    opt = torch.optim.Adam([p], lr=1e-3)
    state = update.OptimizerState()
    for step in steps(3, 4, OPTS["adam"]):
        g = ref.delta_ref([noise.tensor_key(k, "w") for k in step.keys], step.coefficients, 1000, "cpu")
        p.grad = -g
        opt.step()
        update.apply_step(master, state, step)
    assert torch.allclose(master["w"], p.detach(), rtol=0, atol=1e-6)


def test_perturb_into_parameters():
    """Model parameters (requires_grad) can be written directly, in fp32 and bf16."""
    master = torch.randn(70000, generator=torch.Generator().manual_seed(2))
    scale = noise.round_coefficient(2e-3)
    expect = torch.add(master, torch.mul(ref.noise_ref(5, master.numel()), scale))
    for dtype in (torch.float32, torch.bfloat16):
        p = torch.nn.Parameter(torch.empty(70000, dtype=dtype))
        noise.perturb_(p, master, 5, scale)
        assert torch.equal(p.detach(), expect.to(dtype))


@pytest.mark.parametrize("seed", range(4))
def test_random_shapes_fast_equals_reference(seed):
    """Seeded random shapes (0-size, 1-element, sizes no block divides, above PARALLEL_MIN)."""
    rng = np.random.default_rng(seed)
    shapes = {}
    for i in range(int(rng.integers(2, 7))):
        dims = int(rng.integers(1, 4))
        high = {1: 90_000, 2: 400, 3: 50}[dims]
        shapes[f"layer{i}.w"] = tuple(int(d) for d in rng.integers(0 if dims == 1 else 1, high, dims))
    rule = list(OPTS)[seed % 3]
    g = torch.Generator().manual_seed(seed)
    fast = {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}
    slow = {k: v.clone() for k, v in fast.items()}
    sf, ss = update.OptimizerState(), update.OptimizerState()
    population = int(rng.integers(1, 12))
    for step in steps(3, population, OPTS[rule], seed=seed, mirrored=bool(seed % 2), zero_second=seed == 1):
        update.apply_step(fast, sf, step)
        reference_apply(slow, ss, step)
    for name in fast:
        assert torch.equal(bits(fast[name]), bits(slow[name])), (name, shapes[name])
        for kind in update.BUFFERS[rule]:
            assert torch.equal(bits(sf.buffers[kind][name]), bits(ss.buffers[kind][name])), (kind, name)


def special_master() -> dict[str, torch.Tensor]:
    """−0.0, +0.0, subnormals, normals and extremes, in small and parallel-sized tensors."""
    specials = torch.tensor([-0.0, 0.0, 1e-45, -1e-45, 1e-40, -1e-39, 1.17e-38, 1.0, -2.5, 3e38, -3.4e38, -1e-30])
    big = torch.randn(70001, generator=torch.Generator().manual_seed(0))
    big[::7] = -0.0
    big[3::11] = 1e-41
    return {"s": specials, "big": big, "one": torch.tensor([-0.0]), "none": torch.zeros(0)}


@pytest.mark.parametrize("impl", ["fast", "reference", "fast-kernel"])
def test_zero_sgd_update_leaves_weights_bit_identical(impl):
    """Issue 5: a generation whose coefficients are all 0 changes no bit under SGD."""
    master = special_master()
    before = {k: v.clone() for k, v in master.items()}
    keys = [noise.member_key(7, 1, i // 2) for i in range(6)]
    step = ReplayStep("z", 1, keys, [0.0, -0.0, 0.0, 0.0, 0.0, 0.0], 0.001, {"name": "sgd"})
    if impl == "fast":
        update.apply_step(master, update.OptimizerState(), step)
        update.apply_step(master, update.OptimizerState(), ReplayStep("z", 2, [], [], 0.001, {"name": "sgd"}))
    elif impl == "reference":
        reference_apply(master, update.OptimizerState(), step)
    else:  # the numba kernel itself, without the caller dropping zero members
        items = [(t, [noise.tensor_key(k, name) for k in keys], []) for name, t in master.items()]
        update._apply_fast(items, step.coefficients, 0, [])
    for name in master:
        assert torch.equal(bits(master[name]), bits(before[name])), name
    assert ref.delta_ref(keys, step.coefficients, 3, "cpu").view(torch.int32).tolist() == [-(2**31)] * 3  # −0.0


def test_zero_members_are_skipped_not_added():
    """Dropping c == 0 members changes no bit where Δ ≠ 0 (c·ε ≠ 0 for every c ≠ 0)."""
    master = make_master(5)
    other = {k: v.clone() for k, v in master.items()}
    (step,) = steps(1, 6, OPTS["sgd"], seed=9, mirrored=True, zero_second=True)
    update.apply_step(master, update.OptimizerState(), step)
    keys = [k for k, c in zip(step.keys, step.coefficients, strict=True) if c != 0]
    coefs = [c for c in step.coefficients if c != 0]
    update.apply_step(other, update.OptimizerState(), ReplayStep("t", 1, keys, coefs, 0.001, {"name": "sgd"}))
    assert all(torch.equal(bits(master[n]), bits(other[n])) for n in master)
    assert abs(TABLE_NP).min() > 0 and noise.round_coefficient(2.0**-100) * float(abs(TABLE_NP).min()) > 2.0**-126


@pytest.mark.parametrize("rule", ["momentum", "adam"])
def test_zero_generation_with_state_matches_reference(rule):
    """Momentum/Adam on an all-zero generation: the state still decays and moves θ
    (documented in replay.update); fast and reference agree bit for bit."""
    fast, slow = special_master(), special_master()
    sf, ss = update.OptimizerState(), update.OptimizerState()
    history = steps(2, 4, OPTS[rule], seed=2)
    zero = ReplayStep("t", 3, history[0].keys, [0.0] * 4, 0.001, dict(OPTS[rule]))
    for step in [*history, zero]:
        update.apply_step(fast, sf, step)
        reference_apply(slow, ss, step)
    for name in fast:
        assert torch.equal(bits(fast[name]), bits(slow[name])), name
    assert not torch.equal(fast["big"], special_master()["big"])  # momentum carried: θ moved
