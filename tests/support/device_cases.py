"""Replay on a second device against the CPU, bit for bit, for the kinds and policies the
kernel tests of tests/test_gpu.py do not reach: `quant_scales`, `quant_codes`, the `paths`
rule (a GA's survivors, LM-MA-ES) on full-rank and LoRA masters, and module runs.

Each case takes the `device` to compare with the CPU: test_gpu.py passes "cuda"; passing
"cpu" rehearses the code on a machine without a GPU (a CPU-vs-CPU pass asserts only that the
case runs). The file imports only torch and seedledger at the top, because a module run's
config names `mlp` and `fit` by this file's path and the console script imports it alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from seedledger.ledger import ReplayStep
    from seedledger.replay.update import OptimizerState

    Side = tuple[dict[str, torch.Tensor], OptimizerState]

PATH = Path(__file__).resolve()
MODEL = f"module:{PATH}:mlp"  # what a module run's config stores
TASK = f"fitness:{PATH}:fit"
X = torch.linspace(-1, 1, 64).reshape(16, 4)
Y = torch.sin(X[:, :2] * 3)


def mlp() -> torch.nn.Module:
    """Two linears of odd widths (the update's tails, several tensors)."""
    return torch.nn.Sequential(torch.nn.Linear(4, 37), torch.nn.Tanh(), torch.nn.Linear(37, 2))


def fit(model: torch.nn.Module) -> float:
    """Minus the mean squared error on a fixed batch, on the model's device."""
    device = next(model.parameters()).device
    with torch.no_grad():
        return -float(((model(X.to(device)) - Y.to(device)) ** 2).mean())


def bits(t: torch.Tensor) -> torch.Tensor:
    """`t` on the CPU as integers of its width: −0.0 and NaN payloads compare exactly."""
    t = t.detach().contiguous().cpu()
    return t.view({4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()])


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """The two dicts hold the same names and bits (AssertionError naming the first that differs)."""
    assert list(a) == list(b)
    for name in a:
        assert torch.equal(bits(a[name]), bits(b[name])), name


def _coefficients(gen: torch.Generator, n: int) -> list[float]:
    """Rounded coefficients of mixed sizes, mirrored zeros and a 2**-100 among them."""
    from seedledger.replay.noise import round_coefficient

    raw = (torch.randn(n, generator=gen, dtype=torch.float64)
           * 10.0 ** torch.empty(n, dtype=torch.float64).uniform_(-4, -1, generator=gen)).tolist()
    raw[1::2] = [0.0] * len(raw[1::2])
    raw[2] = 2.0**-100
    return [round_coefficient(x) for x in raw]


QUANT_SHAPES = {"m.q_proj.weight": (4099, 3), "m.v_proj.weight": (7, 130), "m.k_proj.weight": (1, 1),
                "m.down_proj.weight": (576, 1536), "m.norm.weight": (130,)}
QUANT_TARGETS = ("q_proj", "v_proj", "k_proj", "down_proj")


def quant_master(device: str) -> dict[str, torch.Tensor]:
    """A plain fp32 master the int8 kinds quantize: a zero row (scale 1), −0.0 entries."""
    gen = torch.Generator().manual_seed(11)
    master = {n: torch.randn(s, generator=gen) * 0.05 for n, s in QUANT_SHAPES.items()}
    master["m.v_proj.weight"][3] = 0.0
    master["m.q_proj.weight"][::7] = -0.0
    return {n: t.to(device) for n, t in master.items()}


def quant_steps(kind_name: str, device: str, optimizer: dict[str, Any],
                generations: int = 3) -> tuple[Side, Side, ReplayStep]:
    """`generations` steps of the int8 kind on a CPU and a `device` master:
    ((cpu master, cpu state), (device master, device state), the last step)."""
    from seedledger.ledger import ReplayStep
    from seedledger.replay import noise
    from seedledger.replay.kinds import QuantCodes, QuantScales
    from seedledger.replay.update import OptimizerState, apply_step

    kind = {"quant_scales": QuantScales, "quant_codes": QuantCodes}[kind_name].of(QUANT_TARGETS)
    sides = [(quant_master("cpu"), OptimizerState()), (quant_master(device), OptimizerState())]
    gen = torch.Generator().manual_seed(5)
    for g in range(1, generations + 1):
        keys = [noise.member_key(9, g, i // 2) for i in range(8)]
        coefs = _coefficients(gen, 8)
        if kind_name == "quant_scales":  # scales are ~1e-3: smaller steps
            coefs = [noise.round_coefficient(c * 1e-2) for c in coefs]
        step = ReplayStep("dev", g, keys, coefs, noise.round_coefficient(1e-3), dict(optimizer),
                          kind.noise_spec, kind.param_selection)
        for master, state in sides:
            apply_step(master, state, step)
    return sides[0], sides[1], step


def same_state(a: OptimizerState, b: OptimizerState) -> None:
    """Two `OptimizerState`s hold the same step and buffers, bit for bit."""
    assert a.step == b.step and sorted(a.buffers) == sorted(b.buffers)
    for kind in a.buffers:
        same(a.buffers[kind], b.buffers[kind])


def stepped_alike(kind_name: str, device: str, optimizer: dict[str, Any]) -> tuple[dict, dict, ReplayStep, dict]:
    """`quant_steps` on the CPU and `device`, checked alike (the master stays on its device;
    masters, states and fingerprints agree): the two masters, the last step, the plain master."""
    from seedledger.replay.fingerprint import fingerprint

    (cm, cs), (dm, ds), step = quant_steps(kind_name, device, optimizer)
    assert all(t.device.type == torch.device(device).type for t in dm.values())
    same(cm, dm)
    same_state(cs, ds)
    assert fingerprint(cm) == fingerprint(dm)
    return cm, dm, step, quant_master("cpu")


def quant_scales_case(device: str, optimizer: dict[str, Any]) -> None:
    """Three steps quantize once and move only the scales; members' row scales agree."""
    from seedledger.replay import noise, quant
    from seedledger.replay.kinds import QuantScales

    cm, dm, step, plain = stepped_alike("quant_scales", device, optimizer)
    assert all(not torch.equal(cm[quant.scale_name(n)], quant.quantize_rows(plain[n])[1])
               for n in plain if cm[n].dtype == quant.CODE_DTYPE), "every scale vector moved"
    scale = noise.round_coefficient(step.sigma)
    keys, scales = [step.keys[0], step.keys[0], None], [scale, -scale, 0.0]
    linears = [n.removesuffix(".weight") for n, t in cm.items() if t.dtype == quant.CODE_DTYPE]
    kind = QuantScales.of(QUANT_TARGETS)
    same(kind.row_scales(linears, cm, keys, scales, device=torch.device("cpu")),
         kind.row_scales(linears, dm, keys, scales, device=torch.device(device)))


def quant_codes_case(device: str, optimizer: dict[str, Any]) -> None:
    """Three steps move codes through the residual; a member's dequantized genome agrees."""
    from seedledger.replay import quant
    from seedledger.replay.rebuild import apply_member

    cm, dm, step, plain = stepped_alike("quant_codes", device, optimizer)
    assert any(not torch.equal(cm[n], quant.quantize_rows(plain[n])[0])
               for n in plain if cm[n].dtype == quant.CODE_DTYPE), "some codes moved"
    for sign in (1, -1):
        genomes = [dict(cm), dict(dm)]
        for genome in genomes:
            apply_member(genome, step, step.keys[2], sign)
        same(genomes[0], genomes[1])


FULL_SHAPES = {"a": (301, 77), "b": (4099,), "c": (1,)}
LORA_LINEARS = {"m.layers.0.q_proj": (64, 576), "m.layers.0.v_proj": (7, 130)}


def paths_case(device: str, kind: str, form: str, generations: int = 3, population: int = 6) -> None:
    """The `paths` rule (`mix`: a GA's survivors as offsets; `decay`: LM-MA-ES) on a full-rank
    or LoRA master: each generation's members (built from the replay state at its start)
    and then the master and its paths agree bit for bit."""
    from seedledger.ledger import ReplayStep
    from seedledger.replay import noise
    from seedledger.replay.adapter import LoraSpec, initial_adapter, member_adapter
    from seedledger.replay.kinds import member_scale
    from seedledger.replay.rebuild import apply_member
    from seedledger.replay.update import OptimizerState, apply_step

    rc = noise.round_coefficient
    spec = LoraSpec(4, 16.0, ("q_proj", "v_proj"), "seed:3")
    if kind == "lora":
        start, extra = initial_adapter(spec, LORA_LINEARS), ("v1", spec.selection)
    else:
        gen0 = torch.Generator().manual_seed(2)
        start, extra = {n: torch.randn(s, generator=gen0) for n, s in FULL_SHAPES.items()}, ()
    sides = [({n: t.clone() for n, t in start.items()}, OptimizerState()),
             ({n: t.to(device) for n, t in start.items()}, OptimizerState())]
    gen = torch.Generator().manual_seed(3)
    members = [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.5, 0.0], [0.25, 0.75], [0.0, 0.0]][:population]
    for g in range(1, generations + 1):
        keys = [noise.member_key(4, g, i) for i in range(population)]
        rule = {"name": "paths", "move": [rc(0.5), rc(-0.25)], "members": members}
        if form == "mix":
            rule |= {"mix": [[rc(0.5), rc(0.25)], [0.0, rc(1.0)]], "shrink": 1.0,
                     "noise": [_coefficients(gen, population), _coefficients(gen, population)]}
        else:
            rule |= {"decay": [rc(0.9), rc(0.5)], "gain": [rc(0.1), rc(0.3)], "shrink": rc(0.75)}
        step = ReplayStep("dev", g, keys, _coefficients(gen, population), rc(0.0625), rule, *extra)
        for i, (key, sign) in enumerate(zip(keys, [0, 0, 0, 1, -1, 1], strict=False)):
            genomes = [{n: t.clone() for n, t in m.items()} for m, _ in sides]
            for genome, (_, state) in zip(genomes, sides, strict=True):
                apply_member(genome, step, key, sign, member=i, state=state)
            same(genomes[0], genomes[1])
            if kind == "lora":
                scale = member_scale(sign, step.sigma, rule["shrink"])
                same(*(member_adapter(spec, m, key, scale, members[i], state) for m, state in sides))
        for master, state in sides:
            apply_step(master, state, step)
        same(sides[0][0], sides[1][0])
        same_state(sides[0][1], sides[1][1])
    assert sorted(sides[0][1].buffers) == ["path0", "path1"]
    assert any(bool(t.any()) for t in sides[0][1].buffers["path1"].values())


def module_case(device: str, tmp_path: Path, generations: int = 3) -> None:
    """A module run (this file's `mlp` and `fit`) trained on each device verifies on both,
    and the module backend builds each member's parameters to the same bits on both."""
    import seedledger as sl
    from seedledger.engine.runtime.backends.module import ModuleBackend
    from seedledger.replay import noise
    from seedledger.trainers.member import Member

    ledger = tmp_path / "module.db"
    devices = list(dict.fromkeys(("cpu", device)))
    for trained in devices:
        result = sl.evolve(MODEL, TASK, population=8, sigma=0.0625, lr=0.125, generations=generations,
                           ledger=ledger, run=f"m-{trained}", config={"device": trained})
        assert result.run.status == "finished" and result.latest_generation == generations
        for replayed in devices:
            report = sl.verify(f"m-{trained}", ledger=ledger, device=replayed)
            assert report["ok"], (trained, replayed, report)
    master = sl.rebuild(f"m-{device}", ledger=ledger)
    members = [Member(i, noise.member_key(8, 1, i // 2), (1, -1)[i % 2]) for i in range(4)]
    built: dict[str, list[dict[str, torch.Tensor]]] = {}
    for d in devices:
        backend = ModuleBackend(MODEL, device=d)
        on_device = {n: t.to(d) for n, t in master.items()}
        built[d] = []
        for m in members:
            backend.load_member(backend.module, on_device, m, 0.0625, None)
            built[d].append({n: p.detach().clone() for n, p in backend.module.named_parameters()})
    for a, b in zip(built["cpu"], built[device], strict=True):
        same(a, b)
