"""Rebuild and verify from the command line: base model in, replayed weights out.

The replay arithmetic is `replay.rebuild`; this module adds what replay must not know:
where the base model comes from, and how a Hugging Face directory is written.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from engine.models import resolve_model
from engine.refs import resolve_ref
from engine.session import anchors_dir
from ledger import Ledger
from ledger.errors import SeedLedgerError
from replay.fingerprint import fingerprint
from replay.noise import member_key
from replay.rebuild import rebuild, replay_steps


def load_base_master(model_dir: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The base weights as an fp32 master, named as `named_parameters()` names them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {
        name: p.detach().to(device=device, dtype=torch.float32).contiguous()
        for name, p in model.named_parameters()
    }


def write_model_dir(base_dir: Path, master: dict[str, torch.Tensor], output: Path, meta: dict) -> None:
    """Write a transformers/vLLM-loadable directory in the base model's own dtype, atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(master[name].to(device=param.device, dtype=param.dtype))
    output = output.resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(base_dir).save_pretrained(staging)
        (staging / "seedledger.json").write_text(json.dumps(meta, indent=2) + "\n")
        if output.exists():
            shutil.rmtree(output)
        staging.rename(output)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def _base_for(run, base: str | None, device: str) -> tuple[Path, dict[str, torch.Tensor]]:
    model_dir = resolve_model(base or run.base_model)
    master = load_base_master(model_dir, device)
    if run.base_fingerprint and fingerprint(master) != run.base_fingerprint:
        raise SeedLedgerError(
            f"base {base or run.base_model!r} is not the model {run.name} was trained from "
            "(fingerprint differs); pass the right one with --base"
        )
    return model_dir, master


def verify_ref(ledger: Ledger, ref: str, device: str = "cpu") -> dict:
    """Replay from the base (no anchors) and compare every generation's fingerprint."""
    run, gen = resolve_ref(ledger, ref)
    _, master = _base_for(run, None, device)
    master, _ = rebuild(ledger, run.name, gen, master, verify="every", anchors_dir=None)
    ledger.log_event(run.name, "verify", {"generation": gen, "ok": True, "device": device})
    return {
        "run": run.name,
        "generation": gen,
        "generations_checked": gen,
        "fingerprint": fingerprint(master),
        "ok": True,
    }


def rebuild_ref(ledger: Ledger, ref: str, output: Path, base: str | None, device: str) -> dict:
    run, gen = resolve_ref(ledger, ref)
    model_dir, master = _base_for(run, base, device)
    master, _ = rebuild(ledger, run.name, gen, master, verify="end", anchors_dir=anchors_dir(ledger))
    fp = fingerprint(master)
    meta = {"run": run.name, "generation": gen, "fingerprint": fp, "base_model": run.base_model}
    write_model_dir(model_dir, master, output, meta)
    return {**meta, "output": str(output)}


def rebuild_seedfile(path: Path, output: Path, base: str | None, device: str) -> dict:
    """Rebuild from a seed file alone: its header names the base and every step."""
    from ledger.seedfile import read_seedfile

    seeds = read_seedfile(path, key_fn=member_key)
    model_dir = resolve_model(base or seeds.base_model)
    master = load_base_master(model_dir, device)
    if fingerprint(master) != seeds.base_fingerprint:
        raise SeedLedgerError(
            f"{path}: base {base or seeds.base_model!r} has a different fingerprint than the "
            "seed file's base; pass the right one with --base"
        )
    master, _ = replay_steps(master, seeds.steps)
    fp = fingerprint(master)
    if fp != seeds.final_fingerprint:
        from ledger.errors import VerifyMismatch

        raise VerifyMismatch(f"{path}: rebuilt fingerprint {fp} differs from the file's {seeds.final_fingerprint}")
    meta = {"run": seeds.header["run"], "generation": seeds.generation, "fingerprint": fp, "base_model": seeds.base_model}
    write_model_dir(model_dir, master, output, meta)
    return {**meta, "output": str(output)}
