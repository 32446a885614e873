"""`backend: auto`: vLLM where installed and able, hf otherwise; chosen once and stored."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from seedledger.engine.config import validate
from seedledger.engine.runtime.backends import choice
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def cfg(**settings):
    return validate({"model": "tiny", **settings}, "config")


@pytest.fixture
def unpinned(monkeypatch):
    monkeypatch.delenv(choice.PIN, raising=False)


def test_auto_is_the_default_and_explicit_choices_stand(tiny_model_dir, unpinned):
    assert cfg().backend == "auto"
    assert choice.resolve(cfg(backend="hf"), tiny_model_dir) == "hf"
    assert choice.resolve(cfg(backend="vllm"), tiny_model_dir) == "vllm"


@pytest.fixture
def head64(tiny_model_dir, tmp_path) -> Path:
    """A model directory whose config says head size 64 (SmolLM2's; `tiny` has 16, which
    vLLM's CPU attention cannot run): all `resolve` reads of a model is its config."""
    config = json.loads((tiny_model_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "head_dim": 64}))
    return tmp_path


def test_auto_takes_vllm_where_installed(head64, unpinned):
    want = "vllm" if HAS_VLLM else "hf"
    assert choice.resolve(cfg(), head64) == want
    assert choice.resolve(cfg(perturbation="lowrank"), head64) == want


@pytest.mark.parametrize(("settings", "blocker"), [
    ({"kl": {"beta": 0.1}}, "kl"),
    ({"train": "lora"}, "train"),
    ({"train": "lora", "base_quantization": "int8"}, "base_quantization"),
    ({"train": "lora", "algorithm": "lmmaes", "mirrored": False}, "algorithm lmmaes"),
    ({"algorithm": "ga", "mirrored": False, "ga": {"survivors": 2}}, "ga.survivors"),
])
def test_settings_only_hf_builds_keep_hf(head64, unpinned, settings, blocker):
    chosen = cfg(**settings)
    assert choice.hf_only(chosen) == blocker
    assert choice.resolve(chosen, head64) == "hf"


def test_the_device_and_the_head_size_decide_too(head64, tiny_model_dir, unpinned):
    assert choice.hf_only(cfg(device="cuda")) is None
    assert choice.resolve(cfg(device="cuda"), head64) == "hf"
    assert choice.resolve(cfg(), tiny_model_dir) == "hf"  # head size 16


def test_the_pin(head64, monkeypatch):
    monkeypatch.setenv(choice.PIN, "hf")
    assert choice.resolve(cfg(), head64) == "hf"
    monkeypatch.setenv(choice.PIN, "trt")
    with pytest.raises(SeedLedgerError, match="SEEDLEDGER_AUTO_BACKEND='trt': the only pin is hf"):
        choice.resolve(cfg(), head64)


def test_a_run_stores_what_auto_chose(tmp_path):
    """The stored config names the backend, so resume never re-decides."""
    import seedledger as sl

    ledger = tmp_path / "l.db"
    sl.train({"model": "tiny", "generations": 1, "population": 2, "batch_size": 2, "max_new_tokens": 2},
             run="r", ledger=str(ledger))
    with Ledger.open(str(ledger)) as led:
        assert led.get_run("r").config["backend"] == "hf"  # the suite's pin (conftest)
