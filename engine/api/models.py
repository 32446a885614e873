"""The model at a run, a generation, a member or a seed file, rebuilt by replay: as
weights in memory, as a transformers model, or written as a Hugging Face directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seedledger.engine.api.ledger import LedgerArg, ledger_location
from seedledger.ledger import Ledger

if TYPE_CHECKING:
    import torch

def _master(source: str | os.PathLike[str], ledger: LedgerArg, base: str | None, device: str,
            verify: str, allow_unverified: bool):
    from seedledger.engine.rebuild import rebuilding

    where = ledger if isinstance(ledger, Ledger) else ledger_location(ledger)
    return rebuilding.source_master(source, where, base, device, verify=verify, allow_unverified=allow_unverified)


def rebuild(
    source: str | os.PathLike[str],
    *,
    ledger: LedgerArg = None,
    base: str | None = None,
    device: str = "cpu",
    verify: str = "end",
    allow_unverified: bool = False,
) -> dict[str, torch.Tensor]:
    """The fp32 master weights at `source` in memory, by parameter name: the base model
    plus the replay of the history (for a LoRA run, the adapter's weights; for an ESSA run
    its trained form, `.essa.s` with the fixed `.essa.U`/`.essa.Vt`, which
    `replay.adapter.peft_adapter` expands to lora_A/lora_B). `source` is
    RUN, RUN@G or RUN@G#M (the weights member M was evaluated with) in the ledger, or a
    seed file (a `Path`, or a string naming a file and no run of the ledger).
    `verify` checks the fingerprint of the last ("end") or every ("every") generation;
    `base` replaces the recorded base model (same weights, other place)."""
    return _master(source, ledger, base, device, verify, allow_unverified)[1]


def rebuild_model(
    source: str | os.PathLike[str],
    *,
    ledger: LedgerArg = None,
    base: str | None = None,
    device: str = "cpu",
    verify: str = "end",
    allow_unverified: bool = False,
) -> tuple[Any, Any]:
    """(transformers model, tokenizer) at `source` (as in `rebuild`), in the base model's
    dtype, ready for `model.generate`; a LoRA run's adapter comes merged into its base."""
    from transformers import AutoTokenizer

    from seedledger.engine.rebuild.rebuilding import merged_weights, model_from_master

    start, master, _, _ = _master(source, ledger, base, device, verify, allow_unverified)
    model = model_from_master(start.model_dir, merged_weights(start, master)).to(device)
    return model.eval(), AutoTokenizer.from_pretrained(start.model_dir)


def rebuild_to(
    source: str | os.PathLike[str],
    directory: str | os.PathLike[str],
    *,
    ledger: LedgerArg = None,
    base: str | None = None,
    device: str = "cpu",
    verify: str = "end",
    force: bool = False,
    allow_unverified: bool = False,
    upgrade: bool = True,
    merge: bool = False,
) -> dict[str, Any]:
    """Write the model at `source` (RUN, RUN@G, RUN@G#M or a seed file) as a Hugging Face directory
    that transformers and vLLM load (`seedledger rebuild -o`), atomically; returns the
    report (run, generation, fingerprint, output, verified). A directory that is neither
    empty nor an earlier rebuild's output is refused unless `force`. A LoRA run gives a
    PEFT adapter directory, or with `merge` the base with the adapter merged in."""
    from seedledger.engine.rebuild import rebuilding

    where = ledger if isinstance(ledger, Ledger) else ledger_location(ledger)
    return rebuilding.rebuild_source(where, source, Path(directory), base, device, verify=verify, force=force,
                                     upgrade=upgrade, allow_unverified=allow_unverified, merge=merge)
