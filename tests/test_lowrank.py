"""Low-rank perturbations (spec lowrank-v1): parsing, golden vectors, fast == reference,
processes and thread counts, and rebuild / verify / fork / anchors of low-rank runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.records import ReplayStep
from seedledger.replay import _reference as ref
from seedledger.replay import lowrank, noise, perturbation, update
from seedledger.replay.hashing import mix, stable_hash
from seedledger.replay.perturbation import (
    DEFAULT_TARGETS,
    KNOWN_SPECS,
    Perturbation,
    check_spec,
    step_perturbation,
)
from tests.support.replay_cases import reference_apply

ROOT = Path(__file__).resolve().parents[1]
Q = "model.layers.0.self_attn.q_proj.weight"
SUFFIX_ALL = "suffix:" + ",".join(DEFAULT_TARGETS)
OPTS = {
    "sgd": {"name": "sgd"},
    "momentum": {"name": "momentum", "lr": 0.01, "beta": 0.9, "dampening": 0.9},
    "adam": {"name": "adam", "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def digest(t: torch.Tensor) -> str:
    return hashlib.blake2b(t.contiguous().numpy().tobytes(), digest_size=8).hexdigest()


def step(g: int, keys, coefs, opt: dict, rank: int = 4, targets: str = SUFFIX_ALL) -> ReplayStep:
    return ReplayStep("t", g, list(keys), list(coefs), 0.001, dict(opt), f"lowrank-v1:r={rank}", targets)


# --- the spec strings -------------------------------------------------------------------


def test_perturbation_round_trip():
    assert Perturbation.from_run("v1", "all") == Perturbation() and Perturbation().noise_spec == "v1"
    for r in (1, 4, 16, 64):
        p = Perturbation.lowrank(r)
        assert (p.noise_spec, p.param_selection) == (f"lowrank-v1:r={r}", SUFFIX_ALL)
        assert p.noise_spec in KNOWN_SPECS and check_spec(p.noise_spec, p.param_selection) == p
        assert p.inv_sqrt_rank == 1 / r**0.5 and np.log2(p.inv_sqrt_rank).is_integer()
    p = Perturbation.from_run("lowrank-v1:r=16", "suffix:q_proj,attn.c_attn")
    assert p == Perturbation("lowrank", 16, ("q_proj", "attn.c_attn"))
    with pytest.raises(ValueError):
        Perturbation().inv_sqrt_rank  # noqa: B018


@pytest.mark.parametrize("spec,selection", [
    ("v2", "all"), ("", "all"), ("v1", "suffix:q_proj"), ("lowrank-v1:r=2", SUFFIX_ALL),
    ("lowrank-v1:r=04", SUFFIX_ALL), ("lowrank-v1:r=256", SUFFIX_ALL), ("lowrank-v1:r=4", "all"),
    ("lowrank-v1:r=4", "suffix:"), ("lowrank-v1:r=4", "suffix:q_proj,,k_proj"), ("lowrank-v1:r=4", "suffix:q,q"),
    ("lowrank-v1:r=4", "suffix:q proj\nx"), ("lowrank-v2:r=4", SUFFIX_ALL), ("x" * 5000, "all"),
    ("lowrank-v1:r=4", "suffix:" + "a" * 300 + ".\n"),
])
def test_bad_specs_are_one_line_errors(spec, selection):
    with pytest.raises(SeedLedgerError) as exc:
        Perturbation.from_run(spec, selection)
    msg = str(exc.value)
    assert "\n" not in msg and 0 < len(msg) < 300


@pytest.mark.parametrize("rank", [0, 2, 3, 8, 128, -4, True])
def test_lowrank_rank_must_be_a_power_of_4(rank):
    with pytest.raises(SeedLedgerError):
        Perturbation.lowrank(rank)


def test_trained_selects_the_linear_weights():
    p = Perturbation.lowrank(4)
    yes = [Q, "model.layers.3.mlp.down_proj.weight", "q_proj.weight", "x.gate_proj.weight"]
    no = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.bias",
          "model.layers.0.xq_proj.weight", "model.layers.0.input_layernorm.weight"]
    assert all(p.trained(n, (4, 3)) for n in yes)
    assert not any(p.trained(n, (4, 3)) for n in no)
    assert not p.trained(Q, (12,)) and not p.trained(Q, (2, 3, 4))
    assert Perturbation().trained("model.norm.weight", (12,))


def test_step_perturbation_reads_the_step():
    assert step_perturbation(ReplayStep("r", 1, [], [], 0.0, {})) == Perturbation()
    assert step_perturbation(object()) == Perturbation()
    assert step_perturbation(step(1, [], [], {}, rank=16)) == Perturbation.lowrank(16)
    bad = step(1, [1], [0.5], {"name": "sgd"})
    bad.noise_spec = "lowrank-v1:r=5"
    with pytest.raises(SeedLedgerError, match="generation 1: unknown noise spec"):
        update.apply_step({"w": torch.zeros(2, 2)}, update.OptimizerState(), bad)


# --- factors: golden vectors ------------------------------------------------------------

MK = noise.member_key(noise.run_key(0), 1, 0)
# (rank, A[0,0], A[-1,-1], B[0,0], B[-1,-1], digest A, digest B) for Q, shape (7, 130): pins the spec
FACTORS = [
    (1, 0.104827880859375, 0.279541015625, -0.982421875, 0.70947265625, "cfe29038b184d20c", "0ba2a2bfc86629ec"),
    (4, 0.104827880859375, -0.697265625, -0.982421875, 0.12725830078125, "3e4ed87eb68b67b2", "46106acfa74e554f"),
]


def test_factor_keys_are_pinned():
    ka, kb = perturbation.factor_keys(MK, Q)
    assert (ka, kb) == (0x590562E78C1615CA, 0x9C270402FA7B45BA)
    tk = noise.tensor_key(MK, Q)
    assert ka == mix(tk, stable_hash("seedledger/lowrank/v1/A"))
    assert kb == mix(tk, stable_hash("seedledger/lowrank/v1/B"))


@pytest.mark.parametrize("rank,a0,a1,b0,b1,da,db", FACTORS)
def test_factor_golden_vectors(rank, a0, a1, b0, b1, da, db):
    a, b = perturbation.factors(MK, Q, (7, 130), rank)
    assert a.shape == (7, rank) and b.shape == (130, rank) and a.dtype == b.dtype == torch.float32
    assert (a[0, 0].item(), a[-1, -1].item(), b[0, 0].item(), b[-1, -1].item()) == (a0, a1, b0, b1)
    assert (digest(a), digest(b)) == (da, db)
    ka, kb = perturbation.factor_keys(MK, Q)  # row-major: A[o, r] is element o·R + r of key_A's noise
    assert torch.equal(a.view(-1), ref.noise_ref(ka, 7 * rank))
    assert torch.equal(b.view(-1), ref.noise_ref(kb, 130 * rank))


def test_key_table_equals_python_ints():
    rng = np.random.default_rng(0)
    keys = [0, 1, 2**63, 2**64 - 1] + [int(x) for x in rng.integers(0, 2**63, 20, dtype=np.int64) * 2 + 1]
    names = [Q, "a", "", "model.layers.29.mlp.down_proj.weight"]
    table = perturbation.key_table(keys, names)
    assert table.shape == (4, 4, len(keys)) and table.dtype == np.uint64
    for t, name in enumerate(names):
        for m, k in enumerate(keys):
            ka, kb = perturbation.factor_keys(k, name)
            assert [int(x) for x in table[t, :, m]] == [ka, noise.noise_xkey(ka), kb, noise.noise_xkey(kb)]
    assert perturbation.key_table([], names).shape == (4, 4, 0)


@pytest.mark.parametrize("rank", [1, 4])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 130), (0, 4), (5, 0), (130, 7)])
def test_stacked_factors_equal_factors(shape, rank):
    keys = [noise.member_key(9, 2, i) for i in range(3)]
    a, b = perturbation.stacked_factors(keys, Q, shape, rank)
    assert a.shape == (3, shape[0], rank) and b.shape == (3, shape[1], rank)
    for m, k in enumerate(keys):
        fa, fb = perturbation.factors(k, Q, shape, rank)
        assert torch.equal(bits(a[m]), bits(fa)) and torch.equal(bits(b[m]), bits(fb))
    e = perturbation.stacked_factors([], Q, shape, rank)
    assert e[0].shape == (0, shape[0], rank) and e[1].shape == (0, shape[1], rank)
    with pytest.raises(ValueError):
        perturbation.stacked_factors(keys, Q, shape, 2)


# --- the update: golden vectors and the spec itself ---------------------------------------

G_KEYS = [noise.member_key(noise.run_key(0), 1, i // 2) for i in range(5)]  # mirrored pairs
G_COEFS = [noise.round_coefficient(x) for x in (1e-3, 0.0, -2.5e-3, 0.0, 7e-4)]
# digest of the updated q_proj and bit patterns of elements 0, 455, 909 (rank 4, one generation)
G_UPDATE = {
    "sgd": ("fbd3cfcdd9966951", (0xBF47BF45, 0x3E9763A4, 0xBF47ABEF)),
    "adam": ("97beecf2f6724b74", (0xBF47BE77, 0x3E977CEE, 0xBF47BE77)),
}


def golden_master() -> dict[str, torch.Tensor]:
    i = torch.arange(7 * 130)
    return {Q: (((i * 37) % 101 - 50).float() / 64).view(7, 130), "model.embed_tokens.weight": torch.ones(5, 3)}


@pytest.mark.parametrize("rule", list(G_UPDATE))
def test_update_golden_vectors(rule):
    for impl in ("fast", "reference"):
        m, st = golden_master(), update.OptimizerState()
        s = step(1, G_KEYS, G_COEFS, OPTS[rule])
        if impl == "fast":
            update.apply_step(m, st, s)
        else:
            reference_apply(m, st, s)
        flat = bits(m[Q]).view(-1)
        pattern = tuple(int(flat[i]) & 0xFFFFFFFF for i in (0, 455, 909))
        assert (digest(m[Q]), pattern) == G_UPDATE[rule], impl
        assert torch.equal(m["model.embed_tokens.weight"], torch.ones(5, 3))
        assert all(set(b) == {Q} for b in st.buffers.values())


def test_update_follows_the_written_spec():
    """An independent numpy oracle of the docstring's formula (fp32 scalar semantics)."""
    m = golden_master()
    update.apply_step(m, update.OptimizerState(), step(1, G_KEYS, G_COEFS, OPTS["sgd"]))
    theta = golden_master()[Q].numpy().copy()
    g = np.full(theta.shape, -0.0, dtype=np.float32)
    for k, c in zip(G_KEYS, G_COEFS, strict=True):
        if c == 0:
            continue
        ka, kb = (mix(noise.tensor_key(k, Q), stable_hash(f"seedledger/lowrank/v1/{f}")) for f in "AB")
        a = ref.noise_ref(ka, 7 * 4).view(7, 4).numpy()
        b = ref.noise_ref(kb, 130 * 4).view(130, 4).numpy()
        s = np.float32(c * 0.5)
        for r in range(4):
            g = g + (s * a[:, r])[:, None] * b[None, :, r]
    assert np.array_equal((theta + g).view(np.int32), bits(m[Q]).numpy())


def mixed_master(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"model.embed_tokens.weight": (11, 4), "model.norm.weight": (5,), "lm_head.weight": (11, 4),
              "l.0.q_proj.weight": (1, 1), "l.0.k_proj.weight": (3, 5), "l.0.v_proj.weight": (7, 130),
              "l.0.o_proj.weight": (0, 4), "l.0.up_proj.weight": (5, 0), "l.0.down_proj.weight": (130, 7),
              "l.0.gate_proj.weight": (300, 301), "l.0.q_proj.bias": (3,)}
    out = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    out["l.0.k_proj.weight"].view(-1)[:4] = torch.tensor([-0.0, 0.0, 1e-45, -1e-40])
    return out


def records(n: int, population: int, opt: dict, rank: int, seed: int, mirrored: bool) -> list[ReplayStep]:
    rng = np.random.default_rng(seed)
    out = []
    for g in range(1, n + 1):
        keys = [noise.member_key(77, g, i // 2 if mirrored else i) for i in range(population)]
        raw = rng.standard_normal(population) * 10.0 ** rng.uniform(-4, -1)
        if mirrored:
            raw[1::2] = 0.0
        raw[-1] = 2.0**-100 if g % 2 else raw[-1]  # products below 2**-126: subnormal
        out.append(step(g, keys, [noise.round_coefficient(float(x)) for x in raw], opt, rank))
    return out


@pytest.mark.parametrize("blocks", ["default", "tiny"])
@pytest.mark.parametrize("mirrored", [False, True], ids=["distinct", "mirrored-zero"])
@pytest.mark.parametrize("rank", [1, 4])
@pytest.mark.parametrize("rule", list(OPTS))
def test_fast_equals_reference(rule, rank, mirrored, blocks, monkeypatch):
    """``tiny``: one or a few rows per work item and one member per factor group in numba."""
    from seedledger.replay import _cpu_kernels as k

    if blocks == "tiny":
        monkeypatch.setattr(k, "LOWRANK_BLOCK", 700)
        monkeypatch.setattr(k, "LOWRANK_SCRATCH", 1)
    fast, slow = mixed_master(0), mixed_master(0)
    frozen = {n: t.clone() for n, t in fast.items() if not Perturbation.lowrank(rank).trained(n, t.shape)}
    sf, ss = update.OptimizerState(), update.OptimizerState()
    for s in records(3, 5, OPTS[rule], rank, seed=rank, mirrored=mirrored):
        update.apply_step(fast, sf, s)
        reference_apply(slow, ss, s)
    for name in fast:
        assert torch.equal(bits(fast[name]), bits(slow[name])), name
        for kind in update.BUFFERS[rule]:
            assert set(sf.buffers[kind]) == set(ss.buffers[kind])
            assert torch.equal(bits(sf.buffers[kind][name]), bits(ss.buffers[kind][name])) if name not in frozen \
                else name not in sf.buffers[kind]
    assert all(torch.equal(bits(fast[n]), bits(t)) for n, t in frozen.items())
    assert not torch.equal(fast["l.0.gate_proj.weight"], mixed_master(0)["l.0.gate_proj.weight"])


# (rank, member j of member_key(1, 1, j), shape, (o, i, r) where (s·A[o, r])·B[i, r] < 2**-126)
SUBNORMAL = [(1, 81, (371, 197), (370, 196, 0)), (4, 87, (38, 50), (37, 49, 3))]


@pytest.mark.parametrize("rank,member,shape,where", SUBNORMAL)
def test_subnormal_products_are_kept(rank, member, shape, where):
    """A 2**-100 coefficient alone on zero weights, with a member whose factors make one
    product (s·A)·B subnormal: every path keeps it (a flushing device would give 0)."""
    key = noise.member_key(1, 1, member)
    a, b = perturbation.factors(key, Q, shape, rank)
    o, i, r = where
    prod = (np.float32(2.0**-100 / rank**0.5) * a[o, r].numpy()) * b[i, r].numpy()
    assert 0 < abs(prod) < 2.0**-126
    fast, slow = {Q: torch.zeros(shape)}, {Q: torch.zeros(shape)}
    s = step(1, [key], [2.0**-100], OPTS["sgd"], rank)
    update.apply_step(fast, update.OptimizerState(), s)
    reference_apply(slow, update.OptimizerState(), s)
    assert torch.equal(bits(fast[Q]), bits(slow[Q]))
    if rank == 1:  # g is that product itself
        assert fast[Q][o, i].item() == float(prod)


def test_all_zero_generation_is_identity():
    master = mixed_master(1)
    before = {k: v.clone() for k, v in master.items()}
    keys = [noise.member_key(1, 1, i) for i in range(4)]
    update.apply_step(master, update.OptimizerState(), step(1, keys, [0.0] * 4, OPTS["sgd"]))
    update.apply_step(master, update.OptimizerState(), step(2, [], [], OPTS["sgd"]))
    lowrank.apply([(Q, master["l.0.k_proj.weight"], [])], keys, [0.0] * 4, 0, [], 4)  # the kernel skips zeros
    assert all(torch.equal(bits(master[k]), bits(before[k])) for k in master)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_perturb_lowrank_is_one_member_update(dtype):
    master = mixed_master(2)["l.0.v_proj.weight"]
    key, scale = noise.member_key(3, 1, 0), noise.round_coefficient(-1e-3)
    expect = master.clone()
    lowrank.apply([("l.0.v_proj.weight", expect, [])], [key], [scale], 0, [], 4, reference=True)
    out = torch.empty(master.shape, dtype=dtype)
    assert lowrank.perturb_lowrank_(out, master, key, "l.0.v_proj.weight", scale, 4) is out
    assert torch.equal(out, expect.to(dtype))
    a, b = perturbation.factors(key, "l.0.v_proj.weight", tuple(master.shape), 4)
    assert (expect.double() - (master.double() + scale / 2 * (a.double() @ b.double().T))).abs().max() < 1e-6
    lowrank.perturb_lowrank_(out, master, key, "l.0.v_proj.weight", 0.0, 4)
    assert torch.equal(out, master.to(dtype))
    with pytest.raises(ValueError):
        lowrank.perturb_lowrank_(out, master, key, "x", 0.1, 4)  # not rounded
    with pytest.raises(ValueError):
        lowrank.perturb_lowrank_(torch.empty(3), torch.zeros(3), key, "x", scale, 4)


def test_numba_kernel_has_no_fma():
    """(s·A)·B is not exact, so a contracted multiply-add would change bits. The cached
    kernel has no inspectable assembly, so its code is compiled again with the same options
    (and, as a control, with fastmath's ``contract``, which does emit FMAs on such a CPU)."""
    import re

    import numba

    from seedledger.replay import _cpu_kernels as k
    from seedledger.replay.table import TABLE_NP

    def asm(**extra) -> str:
        f = numba.njit(**{**k._OPTS, "cache": False, **extra})(k._lowrank_block.py_func)
        theta = np.zeros(15, dtype=np.float32)
        for rule in (0, 1, 2):
            f(theta, 3, 5, 0, perturbation.key_table([1], ["x"])[0], np.ones(1, np.float32), 4, TABLE_NP, rule,
              np.ones(7, np.float32), theta.copy(), theta.copy(), k.LOWRANK_BLOCK, k.LOWRANK_SCRATCH)
        return f.inspect_asm(f.signatures[0]).lower()

    fma = re.compile(r"\bv?fn?m(add|sub)")
    code = asm()
    assert "vmulps" in code or "mulps" in code or "mulss" in code
    assert not fma.search(code)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and " fma " in cpuinfo.read_text():
        assert fma.search(asm(fastmath={"contract"}))  # the check can see an FMA


PROBE = r"""
import json, torch
from seedledger.replay import noise, update, fingerprint
from seedledger.ledger.records import ReplayStep
out = {"threads": __import__("numba").get_num_threads()}
g = torch.Generator().manual_seed(0)
master = {"a.q_proj.weight": torch.randn(300, 700, generator=g), "b.up_proj.weight": torch.randn(130, 7, generator=g),
          "c.v_proj.weight": torch.randn(1, 1, generator=g), "embed.weight": torch.randn(9, 4, generator=g)}
for name, opt in [("sgd", {}), ("momentum", {"lr": 0.01, "dampening": 0.9}), ("adam", {"lr": 0.001})]:
    for rank in (1, 4):
        m = {k: v.clone() for k, v in master.items()}
        st = update.OptimizerState()
        for gen in range(1, 3):
            keys = [noise.member_key(99, gen, i // 2) for i in range(6)]
            coefs = [noise.round_coefficient((-1) ** i * 0.01 * (i + 1)) if i % 2 == 0 else 0.0 for i in range(6)]
            update.apply_step(m, st, ReplayStep("p", gen, keys, coefs, 0.001, {"name": name, **opt},
                                                f"lowrank-v1:r={rank}", "suffix:q_proj,up_proj,v_proj"))
        out[f"{name}/{rank}"] = fingerprint.fingerprint(m)
print(json.dumps(out))
"""


def run_probe(env_extra: dict[str, str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_processes_thread_counts_and_reference_agree():
    one = run_probe({"NUMBA_NUM_THREADS": "1"})
    two = run_probe({"NUMBA_NUM_THREADS": "2"})
    assert (one.pop("threads"), two.pop("threads")) == (1, 2)
    reference = run_probe({"SEEDLEDGER_REPLAY_IMPL": "reference"})
    reference.pop("threads")
    assert one == two == reference
    assert len(set(one.values())) == len(one)
