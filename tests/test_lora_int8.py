"""LoRA on an int8 base (torchao weight-only): the base is quantized and fingerprinted as
loaded, and a run resumes after SIGKILL to the same bits and refuses another base.
`make test` runs these apart, with torchao on PYTHONPATH (the int8 marker)."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from seedledger.engine.runtime import session
from seedledger.ledger import Ledger
from tests.support.runs import cli as _cli
from tests.support.runs import fingerprints as _fingerprints
from tests.test_lora import _config

# ----------------------------------------------------------------------------- an int8 base


@pytest.fixture(scope="module")
def int8_run(tmp_path_factory):
    pytest.importorskip("torchao")
    tmp = tmp_path_factory.mktemp("int8")
    ledger_path = tmp / "q.db"
    with Ledger.open(str(ledger_path)) as led:
        session.start(led, str(_config(tmp, "q", base_quantization="int8", generations=2)), "q", [], None)
        session.start(led, str(_config(tmp, "fp32")), "fp32", [], 0)  # the same adapter on the fp32 base
    return tmp, ledger_path, _fingerprints(ledger_path, "q")


@pytest.mark.int8
def test_int8_base_is_quantized_and_fingerprinted_as_loaded(int8_run, tiny_model_dir):
    from seedledger.engine.runtime.models.adapters import frozen_fingerprint, frozen_tensors
    from seedledger.engine.runtime.models.resolve import load_causal_lm

    _, ledger_path, fps = int8_run
    q = load_causal_lm(tiny_model_dir, quantization="int8")
    parts = frozen_tensors(q)
    assert any(t.dtype == torch.int8 for t in parts.values())
    assert frozen_fingerprint(q) != frozen_fingerprint(load_causal_lm(tiny_model_dir))
    with Ledger.open(str(ledger_path)) as led:
        assert led.get_run("q").base_fingerprint != led.get_run("fp32").base_fingerprint
        assert led.get_run("q").dtype_policy == "fp32-adapter/int8-base/float32-eval"
    assert len(set(fps)) == 2


@pytest.mark.int8
def test_int8_run_resumes_to_the_same_fingerprints_and_refuses_another_base(int8_run):
    tmp, ledger_path, fps = int8_run
    crash = tmp / "crash.db"
    cmd = ["train", str(_config(tmp, "q", base_quantization="int8", generations=2)), "--run", "q",
           "--ledger", str(crash)]
    proc = _cli(*cmd, env=os.environ | {"SEEDLEDGER_FAILPOINT": "committed@1"}, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    _cli("resume", "q", "--ledger", str(crash))
    assert _fingerprints(crash, "q") == fps
    _cli("verify", "q", "--ledger", str(crash))
    proc = _cli("fork", "q@1", "--run", "plain", "--set", "base_quantization=none", "--ledger", str(crash),
                check=False)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "base_quantization none" in proc.stderr
    with Ledger.open(str(crash)) as led:
        assert not led.has_run("plain")
