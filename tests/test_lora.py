"""LoRA adapters as the trained parameters: the spec, the exact initial adapter, batched
member evaluation, PEFT in and out, merging, and adapter runs end to end on `tiny`
(verify, SIGKILL + resume, forks, seed files, anchors, a warm start, CMA-ES on the adapter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from seedledger.engine.rebuild.rebuilding import verify_ref
from seedledger.engine.runtime import session
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay import noise
from seedledger.replay.adapter import (
    LoraSpec,
    init_key,
    init_scale,
    initial_adapter,
    parse_selection,
    start_fingerprint,
)
from seedledger.replay.perturbation import Perturbation
from tests.support.runs import cli as _cli
from tests.support.runs import fingerprints as _fingerprints
from tests.support.runs import rebuilt_from_ledger_and_seed_file

SIGMA = noise.round_coefficient(0.05)  # large enough that members really differ on `tiny`
PROMPTS = [
    [{"role": "user", "content": "What is 2+3?"}],
    [{"role": "user", "content": "Name a colour, please, in one word."}],
    [{"role": "user", "content": "Hi"}],
]
LORA = {
    "model": "tiny",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 30}]},
    "train": {"kind": "lora", "rank": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]},
    "population": 4,
    "sigma": 0.05,
    "lr": 0.05,
    "generations": 3,
    "batch_size": 2,
    "max_new_tokens": 6,
    "seed": 3,
}


def _config(tmp_path: Path, name: str = "lora", **changes) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(LORA | changes))
    return path


# ----------------------------------------------------------------------------- the spec


def test_spec_round_trips_and_is_canonical():
    spec = LoraSpec(8, 16, ("q_proj", "v_proj"), "seed:7")
    assert spec.selection == "lora-v1:r=8,alpha=16.0,init=seed:7,targets=q_proj,v_proj"
    assert parse_selection(spec.selection) == spec
    p = Perturbation.from_run("v1", spec.selection)
    assert p.kind == "full" and p.adapter == spec and p.param_selection == spec.selection
    assert p.noise_spec == "v1" and spec.scale == 2.0 and spec.init_seed == 7
    assert spec.matches("model.layers.0.self_attn.q_proj") and not spec.matches("model.layers.0.self_attn.k_proj")


@pytest.mark.parametrize("noise_spec,selection,message", [
    ("v1", "lora-v1:r=8,alpha=16,init=seed:7,targets=q_proj", "not canonical"),
    ("v1", "lora-v1:r=0,alpha=16.0,init=seed:7,targets=q_proj", "rank"),
    ("v1", "lora-v1:r=8,alpha=-1.0,init=seed:7,targets=q_proj", "alpha"),
    ("v1", "lora-v1:r=8,alpha=16.0,init=pickle:x,targets=q_proj", "bad LoRA parameter selection"),
    ("v1", "lora-v1:r=8,alpha=16.0,init=seed:7,targets=q_proj,q_proj", "repeats"),
    ("v1", "lora-v1:r=8,alpha=nan,init=seed:7,targets=q_proj", "alpha"),
    ("lowrank-v1:r=4", "lora-v1:r=8,alpha=16.0,init=seed:7,targets=q_proj", "noise spec 'v1'"),
])
def test_bad_specs_are_one_line_errors(noise_spec, selection, message):
    with pytest.raises(SeedLedgerError, match=message) as info:
        Perturbation.from_run(noise_spec, selection)
    assert "\n" not in str(info.value)


def test_initial_adapter_is_exact_noise_at_peft_variance():
    spec = LoraSpec(4, 8.0, ("q_proj",), "seed:3")
    shapes = {"m.layers.0.q_proj": (32, 768), "m.layers.1.q_proj": (48, 64)}
    master = initial_adapter(spec, shapes)
    assert list(master) == ["base_model.model.m.layers.0.q_proj.lora_A.weight",
                            "base_model.model.m.layers.0.q_proj.lora_B.weight",
                            "base_model.model.m.layers.1.q_proj.lora_A.weight",
                            "base_model.model.m.layers.1.q_proj.lora_B.weight"]
    a = master["base_model.model.m.layers.0.q_proj.lora_A.weight"]
    assert a.shape == (4, 768) and a.dtype == torch.float32
    eps = noise.generate(noise.tensor_key(init_key(3), "base_model.model.m.layers.0.q_proj.lora_A.weight"), a.numel())
    c = init_scale(768)
    assert torch.equal(a.view(-1), eps * c)  # c·ε exact: one product, no rounding
    assert abs(c - (3 * 768) ** -0.5) / c < 2**-11
    assert abs(float(a.var()) * 3 * 768 - 1) < 0.1  # PEFT's kaiming_uniform(a=√5) variance 1/(3·in)
    b = master["base_model.model.m.layers.0.q_proj.lora_B.weight"]
    assert b.shape == (32, 4) and not b.any()
    again = initial_adapter(spec, shapes)
    assert all(torch.equal(master[n], again[n]) for n in master)
    other = initial_adapter(LoraSpec(4, 8.0, ("q_proj",), "seed:4"), shapes)
    assert not torch.equal(other[next(iter(other))], a)


def test_start_fingerprint_binds_the_frozen_base():
    master = initial_adapter(LoraSpec(1, 1.0, ("q",), "seed:0"), {"x.q": (2, 3)})
    plain = start_fingerprint(master)
    assert start_fingerprint(master, "a" * 32) not in (plain, start_fingerprint(master, "b" * 32))


# ----------------------------------------------------------------------------- the HF backend

SPEC = LoraSpec(4, 16.0, ("q_proj", "v_proj", "down_proj"), "seed:3")
KEYS = (11, 11, 29, 29)  # two mirrored pairs
SIGNS = (1, -1, 1, -1)


def _trained(master: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A master whose B is not zero (as after training), exactly representable."""
    return {n: t + noise.generate(noise.tensor_key(5, n), t.numel()).view(t.shape) * 0.0625
            if n.endswith("lora_B.weight") else t.clone() for n, t in master.items()}


def _member(master, key: int, sign: int) -> dict[str, torch.Tensor]:
    """Member (key, sign)'s adapter written out by plain torch: master + (sign·σ)·ε."""
    return {n: t + noise.generate(noise.tensor_key(key, n), t.numel()).view(t.shape) * (sign * SIGMA)
            for n, t in master.items()}


@pytest.fixture(scope="module")
def lora_backends(tiny_model_dir):
    from seedledger.engine.runtime.backends.hf import HFBackend

    p = Perturbation.lora(SPEC)
    batched, single = HFBackend(tiny_model_dir, perturbation=p), HFBackend(tiny_model_dir, perturbation=p)
    master = _trained(batched.master())
    batched.load_master(master)
    return batched, single, master


def test_members_in_one_forward_equal_each_members_adapter_alone(lora_backends):
    from seedledger.engine.runtime.backends.base import Population

    batched, single, master = lora_backends
    enc = batched._encode([q for _ in KEYS for q in PROMPTS])
    with torch.inference_mode(), batched.members(master, KEYS, SIGNS, SIGMA):
        together = batched.model(**enc).logits
    out = batched.evaluate(master, Population(KEYS, SIGNS, SIGMA, (None,) * 4), PROMPTS, max_new_tokens=8)
    for m, (key, sign) in enumerate(zip(KEYS, SIGNS, strict=True)):
        single.load_master(_member(master, key, sign))
        with torch.inference_mode():
            alone = single.model(**single._encode(PROMPTS)).logits
        rows = together[m * len(PROMPTS) : (m + 1) * len(PROMPTS)]
        assert (rows - alone).abs().max().item() < 1e-4
        assert out.completions[m] == single.generate(PROMPTS, max_new_tokens=8)
    assert out.completions[0] != out.completions[1]  # a pair's two signs decode differently
    single.load_master(master)  # after the members, the master adapter alone again
    assert batched.generate(PROMPTS, max_new_tokens=8) == single.generate(PROMPTS, max_new_tokens=8)


def test_rows_may_name_their_member(lora_backends):
    """Any row order (token scoring slices rows): row i gets member `of_row[i]`'s adapter."""
    batched, _, master = lora_backends
    order = [(m, q) for m in (3, 0, 2) for q in (1, 0)]
    with torch.inference_mode(), batched.members(master, KEYS, SIGNS, SIGMA):
        together = batched.model(**batched._encode([q for _ in KEYS for q in PROMPTS])).logits
        with batched._rows.rows([m for m, _ in order]):
            enc = batched._encode([PROMPTS[q] for _, q in order])
            picked = batched.model(**enc).logits
    for i, (m, q) in enumerate(order):
        want = together[m * len(PROMPTS) + q]
        width = int(enc["attention_mask"][i].sum())  # left padding differs between batches
        assert (picked[i, -width:] - want[-width:]).abs().max().item() < 1e-4


def test_member_adapters_are_perturb_bits(lora_backends):
    batched, _, master = lora_backends
    terms = batched._rows.adapters(SPEC, master, [11], [-1], SIGMA)
    name = next(iter(terms))
    a = f"base_model.model.{name}.lora_A.weight"
    want = _member(master, 11, -1)[a]
    assert torch.equal(terms[name].down[0].transpose(0, 1), want)  # exactly cast(master + s·ε)


def test_peft_loads_the_rebuilt_directory_and_decodes_the_same(lora_backends, tiny_model_dir, tmp_path):
    peft = pytest.importorskip("peft")
    from seedledger.engine.runtime.backends.hf import HFBackend
    from seedledger.engine.runtime.models.adapters import read_peft_dir, write_peft_dir

    batched, _, master = lora_backends
    write_peft_dir(tmp_path / "ad", master, SPEC, str(tiny_model_dir))
    plain = HFBackend(tiny_model_dir)
    plain.model = peft.PeftModel.from_pretrained(plain.model, str(tmp_path / "ad"))
    loaded = {k.replace(".default", ""): v for k, v in plain.model.state_dict().items() if "lora_" in k}
    assert set(loaded) == set(master) and all(torch.equal(loaded[n], master[n]) for n in master)
    prompts = PROMPTS + [[{"role": "user", "content": f"Count to {n}."}] for n in range(3, 8)]
    ours = batched.generate(prompts, max_new_tokens=12)
    assert plain.generate(prompts, max_new_tokens=12) == ours
    assert ours != HFBackend(tiny_model_dir).generate(prompts, max_new_tokens=12)  # the adapter matters
    params, tensors = read_peft_dir(tmp_path / "ad")
    assert params == {"rank": 4, "alpha": 16.0, "targets": ("down_proj", "q_proj", "v_proj")}
    assert all(torch.equal(tensors[n], master[n]) for n in master)


def test_merged_weights_are_base_plus_adapter(lora_backends, tiny_model_dir):
    from seedledger.engine.runtime.backends.hf import HFBackend
    from seedledger.engine.runtime.models import adapters

    batched, _, master = lora_backends
    modules = list(adapters.target_linears(batched.model, SPEC))
    base = adapters.dequantized(batched.model)
    merged = adapters.merge({n: t.clone() for n, t in base.items()}, master, SPEC, modules)
    for module in modules:
        a = master[f"base_model.model.{module}.lora_A.weight"].double()
        b = master[f"base_model.model.{module}.lora_B.weight"].double()
        want = base[f"{module}.weight"].double() + 4.0 * (b @ a)
        assert (merged[f"{module}.weight"].double() - want).abs().max() < 1e-6
    untouched = set(base) - {f"{m}.weight" for m in modules}
    assert untouched and all(torch.equal(merged[n], base[n]) for n in untouched)
    full = HFBackend(tiny_model_dir)
    full.load_master(merged)
    enc = full._encode(PROMPTS)
    with torch.inference_mode():
        assert (full.model(**enc).logits - batched.model(**enc).logits).abs().max() < 1e-4


@pytest.mark.parametrize("config,message", [
    ({"peft_type": "IA3"}, "peft_type"),
    ({"use_dora": True}, "use_dora"),
    ({"target_modules": "q_proj|v_proj"}, "regex"),
    ({"bias": "all"}, "bias"),
    ({"rank_pattern": {"q_proj": 2}}, "rank_pattern"),
])
def test_peft_directories_we_cannot_evaluate_are_refused(lora_backends, tmp_path, config, message):
    from seedledger.engine.runtime.models.adapters import peft_config, read_peft_dir, write_peft_dir

    _, _, master = lora_backends
    write_peft_dir(tmp_path, master, SPEC, "tiny")
    (tmp_path / "adapter_config.json").write_text(json.dumps(peft_config(SPEC, "tiny") | config))
    with pytest.raises(SeedLedgerError, match=message) as info:
        read_peft_dir(tmp_path)
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    ledger_path = tmp / "ref.db"
    with Ledger.open(str(ledger_path)) as led:
        result = session.start(led, str(_config(tmp)), "ref", [], None)
    return ledger_path, _fingerprints(ledger_path, "ref"), result


def test_run_records_the_adapter_and_verifies(reference, tiny_model_dir):
    ledger_path, fps, result = reference
    assert len(set(fps)) == 3 and result.fingerprint == fps[-1]
    with Ledger.open(str(ledger_path)) as led:
        run = led.get_run("ref")
        assert run.noise_spec == "v1"
        assert run.param_selection == "lora-v1:r=4,alpha=16.0,init=seed:3,targets=q_proj,v_proj,down_proj"
        assert run.dtype_policy == "fp32-adapter/none-base/float32-eval"
        assert run.config["train"] == {"kind": "lora", "rank": 4, "alpha": 16.0, "init": None, "init_seed": 3,
                                            "target_modules": ["q_proj", "v_proj", "down_proj"],
                                            "init_fingerprint": None, "essa": False}
        assert run.config["members_per_forward"] == 4
        from seedledger.engine.rebuild.rebuilding import verify_ref

        assert verify_ref(led, "ref")["fingerprint"] == fps[-1]
        from seedledger.replay.rebuild import rebuild

        with pytest.raises(ValueError, match="frozen"):  # an adapter run's replay needs its frozen base
            rebuild(led, "ref", 1, {})


def test_fork_continues_the_adapter_and_refuses_another(reference, tmp_path):
    ledger_path, fps, _ = reference
    with Ledger.open(str(ledger_path)) as led:
        child = session.fork(led, "ref@2", "lower-lr", ["lr=0.02", "seed=9"], 1)
        assert led.get_run("lower-lr").param_selection == led.get_run("ref").param_selection
        from seedledger.engine.rebuild.rebuilding import verify_ref

        assert verify_ref(led, "lower-lr")["fingerprint"] == child.fingerprint
        assert child.fingerprint not in fps
        from seedledger.engine.cli.audit import diff

        report = diff(led, "ref@3", "lower-lr@3")  # the adapters, replayed from their shared @2
        assert report["shared_generations"] == 2 and report["total"]["tensors"] == 2 * 3 * 2
        assert all(".lora_" in t["tensor"] for t in report["tensors"]) and report["total"]["changed"]
        for i, change in enumerate(("train.rank=8", "train=full", "perturbation=lowrank")):
            with pytest.raises(SeedLedgerError) as info:
                session.fork(led, "ref@2", f"bad{i}", [change], 1)
            assert "\n" not in str(info.value)
            assert not led.has_run(f"bad{i}")


def test_seed_file_rebuild_equals_ledger_rebuild_and_peft_dir(reference, tmp_path):
    ledger_path, fps, _ = reference
    led_args = ["--ledger", str(ledger_path)]
    from_ledger, from_seeds = rebuilt_from_ledger_and_seed_file("ref@2", ledger_path, tmp_path)
    assert from_ledger["fingerprint"] == from_seeds["fingerprint"] == fps[1]
    assert from_ledger["format"] == from_seeds["format"] == "peft"
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    from seedledger.engine.runtime.models.adapters import read_peft_dir
    from seedledger.replay.fingerprint import fingerprint

    assert fingerprint(read_peft_dir(tmp_path / "a")[1]) == fps[1]
    merged = json.loads(_cli("rebuild", "ref@2", "-o", str(tmp_path / "m"), "--merge", "--json", *led_args).stdout)
    assert merged["format"] == "merged" and (tmp_path / "m" / "model.safetensors").is_file()

    from safetensors.torch import load_file

    import seedledger as sl

    assert fingerprint(sl.rebuild("ref@2", ledger=ledger_path)) == fps[1]  # the adapter, in memory
    model, _ = sl.rebuild_model("ref@2", ledger=ledger_path)  # the base with the adapter merged in
    written = load_file(tmp_path / "m" / "model.safetensors")
    params = dict(model.named_parameters())
    assert set(written) <= set(params)
    assert all(torch.equal(params[name].detach(), t) for name, t in written.items())


def test_anchors_hold_the_adapter(reference, tmp_path, tiny_model_dir):
    from seedledger.engine.rebuild.rebuilding import load_start
    from seedledger.replay.anchors import load_anchor, max_anchor_bytes, save_anchor
    from seedledger.replay.rebuild import rebuild

    ledger_path, fps, _ = reference
    with Ledger.open(str(ledger_path)) as led:
        run = led.get_run("ref")
        start = load_start("tiny", run.config, run.noise_spec, run.param_selection)
        master, state = rebuild(led, "ref", 2, start.master, frozen=start.frozen)
        info = save_anchor(led, "ref", 2, master, state, tmp_path)
        assert set(load_anchor(info, tmp_path, fps[1], max_anchor_bytes(master))[0]) == set(master)
        again = load_start("tiny", run.config, run.noise_spec, run.param_selection)
        final, _ = rebuild(led, "ref", 3, again.master, anchors_dir=tmp_path, frozen=again.frozen)
    from seedledger.replay.fingerprint import fingerprint

    assert fingerprint(final) == fps[2]


def test_warm_start_from_a_peft_directory(reference, tmp_path):
    """An adapter directory (here: ref@2's, rebuilt) as the initial adapter: its
    fingerprint is recorded and rank/alpha/targets come from it; another adapter under
    the same path is refused when the run resumes."""
    ledger_path, fps, _ = reference
    _cli("rebuild", "ref@2", "-o", str(tmp_path / "sft"), "--ledger", str(ledger_path))
    cfg = LORA | {"train": {"kind": "lora", "init": "sft"}, "generations": 1}
    (tmp_path / "warm.yaml").write_text(yaml.safe_dump(cfg))
    with Ledger.open(str(tmp_path / "w.db")) as led:
        session.start(led, str(tmp_path / "warm.yaml"), "warm", [], None)
        run = led.get_run("warm")
        assert run.param_selection == f"lora-v1:r=4,alpha=16.0,init=peft:{fps[1]},targets=down_proj,q_proj,v_proj"
        assert run.config["train"]["init"] == str(tmp_path / "sft")
    _cli("verify", "warm", "--ledger", str(tmp_path / "w.db"))
    weights = tmp_path / "sft" / "adapter_model.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    first = next(n for n in tensors if n.endswith("lora_B.weight"))
    tensors[first] = tensors[first] + 1.0
    save_file(tensors, str(weights))
    proc = _cli("resume", "warm", "--generations", "1", "--ledger", str(tmp_path / "w.db"), check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "fingerprint" in proc.stderr


def test_cmaes_run_on_the_adapter_moves_and_records_its_ranking(tmp_path):
    """`algorithm: cmaes` with `train: lora`: the CMA mean is the adapter (population 4,
    two generations). Resume, fork and seed file: tests/test_lifecycle.py[Adapter-cmaes]."""
    config = _config(tmp_path, "cmaes-lora", algorithm="cmaes", generations=2, max_new_tokens=4)
    ref = tmp_path / "ref.db"
    with Ledger.open(str(ref)) as led:
        result = session.start(led, str(config), "ref", [], None)
    fps = _fingerprints(ref, "ref")
    assert len(fps) == 2 and result.fingerprint == fps[-1]
    with Ledger.open(str(ref)) as led:
        run = led.get_run("ref")
        assert run.config["algorithm"] == "cmaes"
        assert run.param_selection == "lora-v1:r=4,alpha=16.0,init=seed:3,targets=q_proj,v_proj,down_proj"
        assert len(set(fps + [run.base_fingerprint])) == 3, "each generation moved the adapter"
        for g in (1, 2):
            rec = led.generation("ref", g)
            assert rec.lr == 1.0 and rec.extra["cmaes"]["mu"] == 2
            assert sorted(rec.extra["cmaes"]["ranking"]) == [0, 1, 2, 3]
        report = verify_ref(led, "ref")
        assert report["ok"] and report["fingerprint"] == fps[-1], report
