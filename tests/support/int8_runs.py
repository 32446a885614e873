"""Checks both int8 kinds' runs share (tests/test_quant_scales.py, tests/test_quant_codes.py):
what a fork may not change, and the seed-file and checkpoint round trip of a `ref` run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seedledger.engine.runtime import session
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay import quant
from seedledger.replay.fingerprint import fingerprint
from tests.support.runs import cli, rebuilt_from_ledger_and_seed_file

KIND_CHANGES = ("train=full", "train.targets=[q_proj]", "perturbation=lowrank")


def fork_refuses_another_kind(led: Ledger, parent: str) -> None:
    """Forks of `parent` that change the kind or its targets: one line each, no run left."""
    for i, change in enumerate(KIND_CHANGES):
        with pytest.raises(SeedLedgerError) as info:
            session.fork(led, parent, f"bad{i}", [change], 1)
        assert "\n" not in str(info.value)
        assert not led.has_run(f"bad{i}")


def checkpoint_round_trip(ledger_path: Path, fps: list[str], tmp_path: Path):
    """`ref@3` exported as a seed file, rebuilt from it and from the ledger to the same
    compressed-tensors checkpoint (byte for byte), imported and verified elsewhere; the
    checkpoint holds the master's codes and loads in transformers as diag(s)·Q beside the
    untouched fp32 tensors. Returns (master, written tensors, loaded parameters)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    import seedledger as sl

    from_ledger, from_seeds = rebuilt_from_ledger_and_seed_file("ref@3", ledger_path, tmp_path)
    assert from_ledger["fingerprint"] == from_seeds["fingerprint"] == fps[2]
    assert from_ledger["format"] == from_seeds["format"] == "compressed-tensors-int8"
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    cli("import", str(tmp_path / "ref.seeds"), "--run", "imported", "--ledger", str(tmp_path / "i.db"))
    cli("verify", "imported", "--ledger", str(tmp_path / "i.db"))

    master = sl.rebuild("ref@3", ledger=ledger_path)
    assert fingerprint(master) == fps[2]
    written = load_file(tmp_path / "a" / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a")  # compressed-tensors, dequantized as it loads
    params = dict(model.named_parameters())
    for name, t in master.items():
        if t.dtype == torch.int8:
            assert torch.equal(written[name], t)
            assert torch.equal(params[name].detach(), quant.dequantize(t, master[quant.scale_name(name)]))
        elif not name.endswith(quant.SCALE_SUFFIX):
            assert torch.equal(params[name].detach(), t)
    return master, written, params


CONFIG_REFUSALS = [  # (config additions, the refusal; {kind} is the train kind)
    ({"algorithm": "lmmaes", "mirrored": False}, "algorithm lmmaes: its paths are m copies"),
    ({"algorithm": "ga", "ga": {"survivors": 2}, "mirrored": False}, "ga.survivors: survivors are kept"),
    ({"backend": "vllm"}, "kind {kind} cannot run on backend vllm: its members take the form"),
    ({"base_quantization": "int8"}, "a {kind} run quantizes the base itself"),
]


def config_refuses(kind: str, extra: dict, refusal: str) -> None:
    """A `train: {kind: KIND}` config with `extra` is refused in one line naming `refusal`;
    without it (and as the `train: KIND` shorthand) it validates."""
    from seedledger.engine.config import validate

    with pytest.raises(SeedLedgerError, match=refusal.format(kind=kind)) as info:
        validate({"model": "tiny", "task": "arithmetic", "train": {"kind": kind}, **extra})
    assert "\n" not in str(info.value)
    assert validate({"model": "tiny", "task": "arithmetic", "train": kind}).train.kind == kind
