"""CPU and CUDA give identical noise, updates and fingerprints (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from ledger.records import ReplayStep
from replay import noise, update
from replay.fingerprint import fingerprint

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
