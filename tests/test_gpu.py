"""CPU and CUDA give identical noise, updates and fingerprints (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from seedledger.ledger.records import ReplayStep
from seedledger.replay import noise, update
from seedledger.replay.fingerprint import fingerprint
from tests.support import device_cases
from tests.support.replay_cases import special_values

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

OPTS = [
    {"name": "sgd"},
    {"name": "momentum", "lr": 0.01, "beta": 0.9, "dampening": 0.9},
    {"name": "adam", "lr": 1e-3},
]


@pytest.mark.parametrize("n,offset", [(0, 0), (1, 0), (7, 3), (4097, 1), (1_000_003, 0), (5, 2**40 + 1)])
def test_noise_cpu_equals_cuda(n, offset):
    for key in (0, 12345, 2**64 - 1):
        cpu = noise.generate(key, n, offset=offset)
        gpu = noise.generate(key, n, offset=offset, device="cuda")
        assert gpu.device.type == "cuda"
        assert torch.equal(cpu.view(torch.int32), gpu.cpu().view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_perturb_cpu_equals_cuda(dtype):
    master = torch.randn(3, 4099, generator=torch.Generator().manual_seed(0))
    scale = noise.round_coefficient(-1e-3)
    a = torch.empty(master.shape, dtype=dtype)
    b = torch.empty(master.shape, dtype=dtype, device="cuda")
    noise.perturb_(a, master, 777, scale)
    noise.perturb_(b, master.cuda(), 777, scale)
    assert torch.equal(a, b.cpu())


@pytest.mark.parametrize("optimizer", OPTS, ids=[o["name"] for o in OPTS])
def test_tiny_model_20_generations_cpu_equals_cuda(tiny_model_dir, optimizer):
    from safetensors.torch import load_file

    files = sorted(tiny_model_dir.glob("*.safetensors"))
    raw: dict[str, torch.Tensor] = {}
    for f in files:
        raw |= load_file(str(f))
    cpu = {k: v.float().contiguous() for k, v in raw.items()}
    gpu = {k: v.cuda() for k, v in cpu.items()}
    assert fingerprint(cpu) == fingerprint(gpu)
    s_cpu, s_gpu = update.OptimizerState(), update.OptimizerState()
    gen = torch.Generator().manual_seed(1)
    for g in range(1, 21):
        keys = [noise.member_key(42, g, i) for i in range(8)]
        coefs = [noise.round_coefficient(x) for x in (torch.randn(8, generator=gen) * 1e-3).tolist()]
        step = ReplayStep("gpu", g, keys, coefs, noise.round_coefficient(1e-3), dict(optimizer))
        update.apply_step(cpu, s_cpu, step)
        update.apply_step(gpu, s_gpu, step)
        assert fingerprint(cpu) == fingerprint(gpu), f"generation {g}"
    for k in cpu:
        assert torch.equal(cpu[k].view(torch.int32), gpu[k].cpu().view(torch.int32))


def _needs_triton():
    from seedledger.replay import _backend

    if not _backend.use_triton("cuda"):
        pytest.skip("Triton is not importable (or SEEDLEDGER_REPLAY_IMPL=reference): CUDA uses the reference")


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().cpu()
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def test_triton_noise_equals_reference_on_cuda():
    """The Triton kernel (what CUDA uses) against the torch reference on the same GPU and the CPU."""
    from seedledger.replay import _reference as ref

    _needs_triton()
    assert noise._use_triton(torch.device("cuda"))
    for key in (0, 1, 2**63, 2**64 - 1):
        for n, offset in [(1, 0), (3, 1), (2049, 3), (12_345_679, 7), (9, 2**62 - 3)]:
            gpu = noise.generate(key, n, offset=offset, device="cuda")
            assert torch.equal(_bits(gpu), _bits(ref.noise_ref(key, n, offset, "cuda")))
            if n < 100_000:
                assert torch.equal(_bits(gpu), _bits(ref.noise_ref(key, n, offset)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_perturb_special_values(dtype):
    _needs_triton()
    master = special_values(1_000_003, 3)
    for scale in (noise.round_coefficient(-1e-3), noise.round_coefficient(3e-2), 0.0):
        a = torch.empty(master.shape, dtype=dtype)
        b = torch.empty(master.shape, dtype=dtype, device="cuda")
        noise.perturb_(a, master, 99, scale)
        noise.perturb_(b, master.cuda(), 99, scale)
        assert torch.equal(_bits(a), _bits(b)), (dtype, scale)


@pytest.mark.parametrize("zero_second", [False, True], ids=["pairs", "pairs-zero"])
@pytest.mark.parametrize("optimizer", OPTS, ids=[o["name"] for o in OPTS])
def test_triton_update_random_shapes_cpu_equals_cuda(optimizer, zero_second):
    """Random shapes with −0.0/subnormals/huge values, mirrored keys, 5 generations: the
    Triton update on CUDA equals numba on CPU and the torch reference on CUDA."""
    import numpy as np

    _needs_triton()
    rng = np.random.default_rng(7)
    shapes = {"zero": (0,), "one": (1,), "tail": (1025,), "big": (3_000_017,), "mat": (301, 77)}
    shapes |= {f"r{i}": tuple(int(d) for d in rng.integers(1, 300, int(rng.integers(1, 3)))) for i in range(4)}
    cpu = {k: special_values(int(np.prod(s)), i).view(s) for i, (k, s) in enumerate(shapes.items())}
    gpu = {k: v.cuda() for k, v in cpu.items()}
    ref_gpu = {k: v.cuda() for k, v in cpu.items()}
    states = [update.OptimizerState() for _ in range(3)]
    for g in range(1, 6):
        keys = [noise.member_key(3, g, i // 2) for i in range(10)]
        raw = rng.standard_normal(10) * 10.0 ** rng.uniform(-4, -1)
        if zero_second:
            raw[1::2] = 0.0
        step = ReplayStep("gpu", g, keys, [noise.round_coefficient(float(x)) for x in raw], 0.001, dict(optimizer))
        update.apply_step(cpu, states[0], step)
        update.apply_step(gpu, states[1], step)
        st = states[2]  # the torch reference on CUDA, same bookkeeping as apply_step
        if st.name != optimizer["name"]:
            st.reset(optimizer["name"])
        st.step += 1
        scal = update._scalars(optimizer["name"], step.optimizer, st.step)
        for name, theta in ref_gpu.items():
            bufs = [st.buffer(kind, name, theta) for kind in update.BUFFERS[optimizer["name"]]]
            update.apply_tensor(theta, [noise.tensor_key(k, name) for k in keys], step.coefficients,
                                update.RULES[optimizer["name"]], scal, bufs, fast=False)
    for name in cpu:
        assert torch.equal(_bits(cpu[name]), _bits(gpu[name])), name
        assert torch.equal(_bits(gpu[name]), _bits(ref_gpu[name])), name
        for kind in update.BUFFERS[optimizer["name"]]:
            assert torch.equal(_bits(states[0].buffers[kind][name]), _bits(states[1].buffers[kind][name]))
            assert torch.equal(_bits(states[1].buffers[kind][name]), _bits(states[2].buffers[kind][name]))
    assert fingerprint(cpu) == fingerprint(gpu) == fingerprint(ref_gpu)


LOWRANK = "suffix:q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@pytest.mark.parametrize("kind", ["full", "lowrank"])
def test_triton_zero_sgd_update_is_identity_on_cuda(kind):
    """No non-zero coefficient: every bit stays, −0.0 and subnormals included (a kernel
    whose Δ started at +0 instead of −0 turned −0 weights into +0 on the GPU only)."""
    _needs_triton()
    master = {"l.q_proj.weight": torch.tensor([-0.0, 0.0, 1e-45, -1e-45, 1e-40, -1e-39, 1.0, 3e38]).view(2, 4).cuda(),
              "l.up_proj.weight": special_values(2_000_003, 1).view(2_000_003, 1).cuda()}
    before = {k: v.clone() for k, v in master.items()}
    keys = [noise.member_key(1, 1, i) for i in range(4)]
    extra = ("lowrank-v1:r=4", LOWRANK) if kind == "lowrank" else ()
    update.apply_step(master, update.OptimizerState(),
                      ReplayStep("z", 1, keys, [0.0] * 4, 0.001, {"name": "sgd"}, *extra))
    assert all(torch.equal(_bits(master[k]), _bits(before[k])) for k in master)


@pytest.mark.parametrize("rank", [1, 4, 16])
@pytest.mark.parametrize("optimizer", OPTS, ids=[o["name"] for o in OPTS])
def test_lowrank_update_cpu_equals_cuda(optimizer, rank):
    """The low-rank update (Triton on CUDA, numba on CPU, the reference on CUDA) on odd and
    SmolLM2-like shapes, mirrored zeros and a 2**-100 coefficient; frozen tensors untouched."""
    import numpy as np

    from tests.support.replay_cases import reference_apply

    rng = np.random.default_rng(rank)
    shapes = {"m.embed_tokens.weight": (50, 8), "m.norm.weight": (8,), "l.q_proj.weight": (1, 1),
              "l.k_proj.weight": (3, 5), "l.v_proj.weight": (7, 130), "l.o_proj.weight": (0, 4),
              "l.up_proj.weight": (1536, 576), "l.down_proj.weight": (576, 1536), "l.gate_proj.weight": (301, 77)}
    cpu = {k: special_values(int(np.prod(s)), i).view(s) for i, (k, s) in enumerate(shapes.items())}
    gpu = {k: v.cuda() for k, v in cpu.items()}
    ref_gpu = {k: v.cuda() for k, v in cpu.items()}
    states = [update.OptimizerState() for _ in range(3)]
    for g in range(1, 4):
        keys = [noise.member_key(3, g, i // 2) for i in range(8)]
        raw = rng.standard_normal(8) * 10.0 ** rng.uniform(-4, -1)
        raw[1::2] = 0.0
        raw[2] = 2.0**-100
        step = ReplayStep("gpu", g, keys, [noise.round_coefficient(float(x)) for x in raw], 0.001, dict(optimizer),
                          f"lowrank-v1:r={rank}", LOWRANK)
        update.apply_step(cpu, states[0], step)
        update.apply_step(gpu, states[1], step)
        reference_apply(ref_gpu, states[2], step)
    for name in cpu:
        assert torch.equal(_bits(cpu[name]), _bits(gpu[name])), name
        assert torch.equal(_bits(gpu[name]), _bits(ref_gpu[name])), name
        for kind in update.BUFFERS[optimizer["name"]]:
            if name in states[0].buffers[kind]:
                assert torch.equal(_bits(states[0].buffers[kind][name]), _bits(states[1].buffers[kind][name]))
                assert torch.equal(_bits(states[1].buffers[kind][name]), _bits(states[2].buffers[kind][name]))
    assert fingerprint(cpu) == fingerprint(gpu) == fingerprint(ref_gpu)


def test_lowrank_factors_and_perturb_cpu_equals_cuda():
    from seedledger.replay import lowrank, perturbation

    keys = [noise.member_key(5, 1, i) for i in range(6)]
    for rank in (1, 4, 64):
        for shape in [(1, 1), (7, 130), (576, 1536)]:
            a, b = perturbation.stacked_factors(keys, "l.up_proj.weight", shape, rank)
            ga, gb = perturbation.stacked_factors(keys, "l.up_proj.weight", shape, rank, device="cuda")
            assert ga.device.type == "cuda" and torch.equal(_bits(a), _bits(ga)) and torch.equal(_bits(b), _bits(gb))
    master = special_values(576 * 1536, 4).view(576, 1536)
    scale = noise.round_coefficient(-1e-3)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a = torch.empty(master.shape, dtype=dtype)
        b = torch.empty(master.shape, dtype=dtype, device="cuda")
        lowrank.perturb_lowrank_(a, master, keys[0], "l.up_proj.weight", scale, 4)
        lowrank.perturb_lowrank_(b, master.cuda(), keys[0], "l.up_proj.weight", scale, 4)
        assert torch.equal(_bits(a), _bits(b)), dtype


@pytest.mark.parametrize("kind", ["full", "lowrank"])
def test_loglik_scores_on_cuda_match_cpu(kind, tiny_model_dir):
    """Dense likelihood fitness: the population-batched scores of one generation on CUDA
    equal the CPU's to float tolerance and rank the members the same way (the update that
    follows is exact on either device: benchmarks/cross_device.py's loglik variants)."""
    from seedledger.engine.config import validate
    from seedledger.engine.runtime.backends.base import Population
    from seedledger.engine.runtime.scoring.evaluator import Evaluator
    from seedledger.trainers.es import ES
    from seedledger.trainers.policy_base import State

    base = {"model": "tiny", "task": {"name": "arithmetic", "rewards": ["loglik"]}, "population": 8,
            "batch_size": 5, "seed": 3, "sigma": 0.0625, "perturbation": kind}
    members, _ = ES(8).ask(State(), run_key=99, generation=1, sigma=0.0625)
    population = Population(tuple(m.key for m in members), tuple(m.sign for m in members),
                            0.0625, (None,) * len(members))
    scores = {}
    for device in ("cpu", "cuda"):
        cfg = validate({**base, "device": device})
        ev = Evaluator(cfg, tiny_model_dir)
        _, rows = ev.task.train_batch(cfg.seed, 1, cfg.batch_size)
        prompts = [ev.task.prompt(r) for r in rows]
        refs = ev.task.likelihood_rewards[0].references(rows)
        scores[device] = ev.backend.loglik(ev.master, population, prompts, refs).scores
    worst = max(abs(a - b) for ra, rb in zip(scores["cpu"], scores["cuda"], strict=True)
                for a, b in zip(ra, rb, strict=True))
    print(f"{kind}: max |CPU - CUDA| = {worst:.2e}")
    assert worst < 1e-3
    order = {d: sorted(range(len(members)), key=lambda m: sum(s[m])) for d, s in scores.items()}
    assert order["cpu"] == order["cuda"]


# The kinds and policies beyond the kernels above (tests/support/device_cases.py: each case
# takes the second device, so it is rehearsed CPU-vs-CPU where no GPU is).


@pytest.mark.parametrize("optimizer", OPTS, ids=[o["name"] for o in OPTS])
def test_quant_scales_steps_and_row_scales_cpu_equal_cuda(optimizer):
    """Three quant_scales steps (quantized on the CPU, scales updated by the CUDA kernel):
    codes, scales, moments and the members' row scales are the CPU's bits."""
    device_cases.quant_scales_case("cuda", optimizer)


@pytest.mark.parametrize("optimizer", OPTS, ids=[o["name"] for o in OPTS])
def test_quant_codes_steps_and_genomes_cpu_equal_cuda(optimizer):
    """Three quant_codes steps on odd and SmolLM2-like shapes: codes, residual, moments and
    a member's dequantized genome are the CPU's bits."""
    device_cases.quant_codes_case("cuda", optimizer)


@pytest.mark.parametrize("form", ["mix", "decay"], ids=["ga-survivors", "lmmaes"])
@pytest.mark.parametrize("kind", ["full", "lora"])
def test_paths_members_and_steps_cpu_equal_cuda(kind, form):
    """The `paths` rule (a GA's survivors as offsets, LM-MA-ES's decaying paths) on a
    full-rank and a LoRA master: members, master and paths are the CPU's bits."""
    device_cases.paths_case("cuda", kind, form)


def test_module_run_trained_on_either_device_verifies_on_both(tmp_path):
    """A module run (an MLP) trained on CUDA verifies on the CPU and the other way round,
    and the module backend builds members to the CPU's bits on CUDA."""
    device_cases.module_case("cuda", tmp_path)
