"""Rebuild output: where a rebuilt model goes and how it gets there. A Hugging Face
directory (or a PEFT adapter directory) in the base model's dtype, written beside the
target and renamed into place, never over something seedledger did not write
(`check_output`, before any work and again before the rename)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from seedledger.ledger.durable import (
    as_umask_allows,
    disk_full,
    holds_ledger,
    is_sqlite_file,
    write_error,
)
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay import quant
from seedledger.replay.kinds.forms import MasterForm

if TYPE_CHECKING:
    from seedledger.engine.rebuild.sources import Start

MARKER = "seedledger.json"  # written into every rebuild output: its run, generation, fingerprint
QUANTIZED_FORMAT = "compressed-tensors-int8"  # a quantized master's directory (`write_quantized_dir`)


def is_rebuild_output(path: Path) -> bool:
    """True when `path` is a directory an earlier `seedledger rebuild` wrote."""
    try:
        meta = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and {"run", "generation", "fingerprint"} <= meta.keys()


def check_output(output: Path, force: bool = False, keep: Path | None = None) -> None:
    """Refuse an output that would destroy something seedledger did not write: an existing
    file, a non-empty directory that is not an earlier rebuild's output (unless `force`),
    and, even with `force`, the current directory, one of its parents, a directory that
    holds `keep` (the ledger) or any SQLite database. Called before any work, so a
    refusal costs nothing."""
    target = output.expanduser().resolve()
    if not target.exists():
        return
    if not target.is_dir():
        ledger = " (an SQLite database: a ledger is never written over)" if holds_ledger(target) else ""
        raise SeedLedgerError(f"-o {output}: exists and is not a directory{ledger}")
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise SeedLedgerError(f"-o {output}: refusing to replace the current directory or a parent of it")
    if keep is not None and target in keep.expanduser().resolve().parents:
        raise SeedLedgerError(f"-o {output}: refusing to replace a directory that holds the ledger {keep}")
    found = _sqlite_file_in(target)
    if found is not None:
        raise SeedLedgerError(
            f"-o {output}: refusing to replace a directory that holds an SQLite database ({found})"
        )
    if force or is_rebuild_output(target) or not any(target.iterdir()):
        return
    raise SeedLedgerError(
        f"-o {output}: directory is not empty and is not an earlier rebuild's output "
        f"(no {MARKER}); pick another directory or pass --force to replace it"
    )


def _sqlite_file_in(directory: Path) -> Path | None:
    """The first SQLite database (a ledger, perhaps) under `directory`, links not followed."""
    for root, _dirs, files in os.walk(directory):
        for name in files:
            if is_sqlite_file(Path(root, name), follow_symlinks=False):
                return Path(root, name)
    return None


def model_from_master(base_dir: Path, master: dict[str, torch.Tensor]) -> Any:
    """The base model's transformers model (in its own dtype) holding `master`'s weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto", local_files_only=True, use_safetensors=True)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(master[name].to(device=param.device, dtype=param.dtype))
    return model


def merged_weights(start: Start, master: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every weight of the model `master` stands for: itself for a full run (a quantized
    master dequantized, diag(s)·Q); for an adapter run the base with the adapter merged in
    (an int8 base dequantized first, since re-quantizing would round the adapter away)."""
    if start.kind.master_form is MasterForm.MODEL:
        return quant.dequantized(master)
    from seedledger.engine.runtime.models import adapters

    modules = list(adapters.target_linears(start.model, start.adapter))
    return adapters.merge(adapters.dequantized(start.model), master, start.adapter, modules)


def write_model_dir(
    base_dir: Path, master: dict[str, torch.Tensor], output: Path, meta: dict,
    force: bool = False, keep: Path | None = None,
) -> None:
    """Write a transformers/vLLM-loadable directory in the base model's own dtype."""
    from transformers import AutoTokenizer

    model = model_from_master(base_dir, master)

    def fill(staging: Path) -> None:
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(base_dir).save_pretrained(staging)

    publish(output, fill, meta, force, keep)


def write_quantized_dir(
    base_dir: Path, master: dict[str, torch.Tensor], output: Path, meta: dict,
    force: bool = False, keep: Path | None = None,
) -> None:
    """Write a quantized master (int8 codes, fp32 per-row scales: `replay.quant`) as a
    compressed-tensors checkpoint that transformers loads: each quantized linear's
    `weight` is its int8 codes and `weight_scale` its scales [out, 1], exactly the master's
    bits; `dequantize: true` in the config makes transformers build diag(s)·Q in fp32 as it
    loads (its compressed int8 forward does not run on the CPU). docs/quantized.md."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    quantized = [n for n, t in master.items() if t.dtype == quant.CODE_DTYPE]
    model = model_from_master(base_dir, quant.dequantized(master))  # every other tensor as trained

    def fill(staging: Path) -> None:
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(base_dir).save_pretrained(staging)
        where: dict[str, str] = {}
        for shard in sorted(staging.glob("*.safetensors")):
            tensors = load_file(str(shard))
            mine = [n for n in quantized if n in tensors]
            for name in mine:
                tensors[name] = master[name].detach().cpu().contiguous()
                tensors[quant.scale_name(name)] = master[quant.scale_name(name)].detach().cpu().view(-1, 1).contiguous()
                where[quant.scale_name(name)] = shard.name
            if mine:
                save_file(tensors, str(shard), metadata={"format": "pt"})
        index = staging / "model.safetensors.index.json"
        if index.exists():
            data = json.loads(index.read_text())
            data["weight_map"].update(where)
            index.write_text(json.dumps(data, indent=2) + "\n")
        config = json.loads((staging / "config.json").read_text())
        config["quantization_config"] = compressed_tensors_config(quantized)
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    publish(output, fill, meta, force, keep)


def compressed_tensors_config(weights: list[str]) -> dict:
    """The `quantization_config` of an int8 weight-only, symmetric, per-channel checkpoint
    whose quantized linears are exactly the modules of `weights`."""
    modules = [n[: -len(".weight")] for n in weights]
    return {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "dequantize": True,
        "config_groups": {"group_0": {
            "targets": [f"re:^{re.escape(m)}$" for m in modules],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                        "dynamic": False},
            "input_activations": None, "output_activations": None, "format": "int-quantized",
        }},
        "ignore": [],
        "kv_cache_scheme": None,
    }


def write_output(start: Start, master: dict[str, torch.Tensor], output: Path, meta: dict, *,
                 merge: bool = False, force: bool = False, keep: Path | None = None) -> dict:
    """The rebuilt model at `output`: a model directory, or for an adapter run a PEFT
    adapter directory (`merge`: the base with the adapter merged in, fp32; an int8 base
    is dequantized first, since re-quantizing would round the adapter away). Returns
    what the report adds. A module run's parameters go in `model.safetensors`."""
    from seedledger.engine.rebuild.module_start import ModuleStart

    if isinstance(start, ModuleStart):
        publish(output, lambda staging: start.write(staging, master), meta, force, keep)
        return {"format": "safetensors"}
    if start.kind.master_form is MasterForm.MODEL:
        if merge:
            raise SeedLedgerError(f"{meta['run']} trains every weight: there is no adapter to --merge")
        if any(t.dtype == quant.CODE_DTYPE for t in master.values()):
            write_quantized_dir(start.model_dir, master, output, meta, force, keep)
            return {"format": QUANTIZED_FORMAT}
        write_model_dir(start.model_dir, master, output, meta, force, keep)
        return {}
    from seedledger.engine.runtime.models import adapters

    meta = {**meta, "adapter": start.adapter.selection, "base_quantization": start.quantization}
    if merge:
        write_model_dir(start.model_dir, merged_weights(start, master), output, {**meta, "merged": True}, force, keep)
        return {"format": "merged"}
    publish(output, lambda staging: adapters.write_peft_dir(staging, master, start.adapter, str(start.model_dir)),
            meta, force, keep)
    return {"format": "peft"}


def publish(output: Path, fill: Callable[[Path], None], meta: dict, force: bool = False,
            keep: Path | None = None) -> None:
    """Write a directory atomically: `fill` writes it beside `output` under a temporary
    name, the marker goes in, and it is renamed into place, so `output` is never
    half-written; what stood there before (an earlier rebuild, or anything with `force`)
    is moved aside first and removed after. Callers run `check_output` before their
    expensive work; it runs again here just before the rename, for anything that
    appeared meanwhile."""
    output = output.expanduser().resolve()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    except OSError as exc:  # a read-only place, a file where a directory should be
        raise SeedLedgerError(f"-o {output}: cannot write in {output.parent}: {exc.strerror}") from None
    old = None
    try:
        try:
            fill(staging)
            (staging / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        except Exception as exc:  # a full disk: one line, and the staging directory goes
            if isinstance(exc, OSError) or disk_full(exc):
                raise write_error(f"-o {output}", exc) from None
            raise
        as_umask_allows(staging)  # mkdtemp's 0700 and safetensors' 0600 are not for sharing
        check_output(output, force, keep)  # again: something may have appeared meanwhile
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old.", dir=output.parent))
            output.rename(old / "previous")
        try:
            staging.rename(output)
        except OSError:
            if old is not None:
                (old / "previous").rename(output)  # put it back
            raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
        if old is not None and old.exists():
            shutil.rmtree(old)
