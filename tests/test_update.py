"""Exact updates: the numba path equals the torch reference bit for bit, for every rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ledger.errors import SeedLedgerError
from ledger.records import GenerationRecord, MemberRecord, ReplayStep
from replay import _reference as ref
from replay import noise, update

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


def steps(n: int, population: int, optimizer: dict, seed: int = 1, mirrored: bool = False) -> list[ReplayStep]:
    rng = np.random.default_rng(seed)
    out = []
    for g in range(1, n + 1):
        keys = [noise.member_key(555, g, i // 2 if mirrored else i) for i in range(population)]
        coefs = [noise.round_coefficient(float(x)) for x in rng.standard_normal(population) * 0.01]
        out.append(ReplayStep("t", g, keys, coefs, noise.round_coefficient(1e-3), dict(optimizer)))
    return out


def reference_apply(master, state, step) -> None:
    """apply_step with the fast path switched off (same bookkeeping, torch arithmetic)."""
    name = step.optimizer["name"]
    if state.name != name:
        state.reset(name)
    state.step += 1
    scal = update._scalars(name, step.optimizer, state.step)
    for tname, theta in master.items():
        bufs = [state.buffer(kind, tname, theta) for kind in update.BUFFERS[name]]
        tkeys = [noise.tensor_key(k, tname) for k in step.keys]
        update.apply_tensor(theta, tkeys, step.coefficients, update.RULES[name], scal, bufs, fast=False)


@pytest.mark.parametrize("mirrored", [False, True], ids=["distinct", "mirrored"])
@pytest.mark.parametrize("rule", list(OPTS))
def test_fast_equals_reference(rule, mirrored):
    fast, slow = make_master(), make_master()
    sf, ss = update.OptimizerState(), update.OptimizerState()
    for step in steps(4, 5, OPTS[rule], mirrored=mirrored):
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
        assert np.array_equal((theta.reshape(-1) + delta).view(np.int32), master[name].numpy().reshape(-1).view(np.int32))


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
