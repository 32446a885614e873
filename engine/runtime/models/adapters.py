"""LoRA adapters on a frozen base, model side: targets, the frozen base's fingerprint,
PEFT adapter directories in and out, and merging (the spec and the seeded initial
adapter are `replay.adapter`).

A PEFT directory is `adapter_config.json` and `adapter_model.safetensors`: JSON and
safetensors only, so reading one runs nothing from it (no pickle, no code). Only what
the adapter path evaluates is accepted: plain LoRA (no DoRA, rsLoRA, bias, rank or alpha
patterns, saved modules) on a list of target-module names; anything else is refused in
one line rather than silently evaluated as something it is not.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.adapter import (
    PREFIX,
    LoraSpec,
    check_adapter,
    peft_adapter,
    singular_form,
    tensor_names,
)
from seedledger.replay.adapter import initial_adapter as seeded_adapter
from seedledger.replay.fingerprint import fingerprint

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
DEFAULT_RANK = 8
DEFAULT_ALPHA = 16.0
MAX_CONFIG_BYTES = 1 << 20
# adapter_config.json keys whose non-default values change what the adapter computes
_UNSUPPORTED = {
    "use_dora": False, "use_rslora": False, "bias": "none", "modules_to_save": None,
    "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
    "fan_in_fan_out": False, "use_qalora": False, "lora_bias": False, "trainable_token_indices": None,
    "target_parameters": None, "alora_invocation_tokens": None,
}


# ----------------------------------------------------------------------------- the model


def target_linears(model: nn.Module, spec: LoraSpec) -> dict[str, nn.Linear]:
    """The linears `spec` targets, by module name in `named_modules()` order."""
    found = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and spec.matches(n)}
    if not found:
        raise SeedLedgerError(f"no linear layer of the model matches the LoRA target modules {list(spec.targets)}")
    return found


def linear_shapes(model: nn.Module, spec: LoraSpec) -> dict[str, tuple[int, int]]:
    """(out, in) of every targeted linear (quantized weights report their logical shape)."""
    return {n: (m.out_features, m.in_features) for n, m in target_linears(model, spec).items()}


def frozen_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The base's parameters as loaded, a quantized one as its plain components
    (`NAME:Int8Tensor.qdata`, `.scale`, ...), so that a fingerprint sees the stored bits."""
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        t = p.detach()
        if type(t) is torch.Tensor or not hasattr(t, "__tensor_flatten__"):
            out[name] = t
            continue
        parts, _ = t.__tensor_flatten__()
        for part in parts:
            out[f"{name}:{type(t).__name__}.{part}"] = getattr(t, part)
    return out


def frozen_fingerprint(model: nn.Module) -> str:
    """The frozen base as loaded (quantized weights included): what an adapter run's base
    fingerprint binds together with its initial adapter (`replay.adapter`)."""
    return fingerprint(frozen_tensors(model))


def dequantized(model: nn.Module) -> dict[str, torch.Tensor]:
    """fp32 copies of every parameter (quantized ones dequantized), by name."""
    out = {}
    for name, p in model.named_parameters():
        t = p.detach()
        if type(t) is not torch.Tensor and hasattr(t, "dequantize"):
            t = t.dequantize()
        out[name] = t.to(torch.float32).clone().contiguous()
    return out


def initial_adapter(model: nn.Module, spec: LoraSpec, init: str | os.PathLike[str] | None) -> dict[str, torch.Tensor]:
    """The run's generation-0 adapter: seeded (`replay.adapter`), or the PEFT directory
    `init`, which must have the fingerprint the spec records."""
    shapes = linear_shapes(model, spec)
    device = next(iter(target_linears(model, spec).values())).weight.device
    return adapter_for_shapes(shapes, spec, init, device)


def adapter_for_shapes(shapes: dict[str, tuple[int, int]], spec: LoraSpec, init: str | os.PathLike[str] | None,
                       device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """`initial_adapter` from the targeted linears' (out, in) alone: a backend that never
    builds a transformers model (vLLM) reads them off a meta-device one."""
    if spec.init_seed is not None:
        return seeded_adapter(spec, shapes, device)
    if init is None:
        raise SeedLedgerError(f"this run starts from a PEFT adapter ({spec.init}): name its directory in train.init")
    params, tensors = read_peft_dir(init)
    if (params["rank"], params["alpha"]) != (spec.rank, spec.alpha) or params["targets"] != spec.targets:
        raise SeedLedgerError(f"{init}: r={params['rank']}, alpha={params['alpha']}, targets "
                              f"{list(params['targets'])} are not the run's (LoRA {spec.selection})")
    master = {n: tensors[n] for module in shapes for n in tensor_names(module) if n in tensors} | tensors
    check_adapter(spec, master, shapes, str(init))
    fp = fingerprint(master)
    if spec.init != f"peft:{fp}":
        raise SeedLedgerError(f"{init}: adapter fingerprint {fp} is not the one the run started from ({spec.init})")
    if spec.essa:
        master = singular_form(master, list(shapes))
    return {n: t.to(device) for n, t in master.items()}


# ----------------------------------------------------------------------------- PEFT directories


def read_peft_dir(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """({rank, alpha, targets}, fp32 tensors named as in the file) of a PEFT LoRA directory;
    one-line SeedLedgerError for anything else."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(path)
    cfg_path, weights = d / CONFIG, d / WEIGHTS
    if not d.is_dir() or not cfg_path.is_file() or not weights.is_file():
        raise SeedLedgerError(f"{path}: not a PEFT adapter directory (needs {CONFIG} and {WEIGHTS})")
    if cfg_path.stat().st_size > MAX_CONFIG_BYTES:
        raise SeedLedgerError(f"{cfg_path}: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise SeedLedgerError(f"{cfg_path}: not valid JSON") from None
    if not isinstance(cfg, dict):
        raise SeedLedgerError(f"{cfg_path}: expected a JSON object")
    params = peft_params(cfg, str(cfg_path))
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:120]
        raise SeedLedgerError(f"{weights}: not a readable safetensors file ({reason})") from None
    for name, t in tensors.items():
        if not name.startswith(PREFIX) or not t.dtype.is_floating_point:
            raise SeedLedgerError(f"{weights}: unexpected tensor {name[:80]!r} ({t.dtype})")
        if not torch.isfinite(t).all():
            raise SeedLedgerError(f"{weights}: tensor {name[:80]!r} holds a non-finite value")
    return params, {n: t.to(torch.float32).contiguous() for n, t in tensors.items()}


def peft_params(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """rank, alpha and targets of a PEFT LoRA config; refuses what the adapter path does
    not evaluate."""
    if cfg.get("peft_type", "LORA") != "LORA":
        raise SeedLedgerError(f"{source}: peft_type {cfg.get('peft_type')!r} is not LORA")
    for key, default in _UNSUPPORTED.items():
        value = cfg.get(key)
        if value is not None and value != default and value not in ({}, [], False):
            raise SeedLedgerError(f"{source}: {key}={value!r} is not supported (plain LoRA only)")
    targets = cfg.get("target_modules")
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise SeedLedgerError(f"{source}: target_modules must be a list of module names (a regex is not supported)")
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise SeedLedgerError(f"{source}: r must be an integer, not {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise SeedLedgerError(f"{source}: lora_alpha must be a number, not {alpha!r}")
    spec = LoraSpec(rank, float(alpha), tuple(sorted(targets)), "seed:0")  # checks the values
    return {"rank": spec.rank, "alpha": spec.alpha, "targets": spec.targets}


def peft_fingerprint(path: str | os.PathLike[str]) -> str:
    """The fingerprint of a PEFT directory's tensors (fp32), what `peft:FP` records."""
    return fingerprint(read_peft_dir(path)[1])


def peft_config(spec: LoraSpec, base: str) -> dict[str, Any]:
    """adapter_config.json for `spec` on the base model `base` (a path or hub name)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "target_modules": list(spec.targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }


def write_peft_dir(directory: Path, master: dict[str, torch.Tensor], spec: LoraSpec, base: str) -> None:
    """Write a PEFT adapter directory: the fp32 tensors exactly as the master holds them
    (an ESSA master as the plain LoRA it describes, B = U·diag(s), A = Vᵀ)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG).write_text(json.dumps(peft_config(spec, base), indent=2) + "\n")
    save_file({n: t.detach().cpu().contiguous() for n, t in peft_adapter(spec, master).items()},
              str(directory / WEIGHTS), metadata={"format": "pt"})


def merge(weights: dict[str, torch.Tensor], master: dict[str, torch.Tensor], spec: LoraSpec,
          modules: list[str]) -> dict[str, torch.Tensor]:
    """W + (alpha/r)·B·A in fp32 on every targeted module's weight, in place in `weights`."""
    master = peft_adapter(spec, master)
    for module in modules:
        a_name, b_name = tensor_names(module)
        w = weights[f"{module}.weight"]
        w += (master[b_name].to(w.device) @ master[a_name].to(w.device)) * spec.scale
    return weights


# ----------------------------------------------------------------------------- config


def resolve(cfg: Any) -> Any:
    """Fill an adapter run's `train` in when the run is created: rank, alpha and targets
    (from `init`'s adapter_config.json, else the defaults), and where A and B start
    (`init_seed`: the run's seed; `init_fingerprint`: the PEFT directory's), so that the
    stored config, resumes and forks name one initial adapter. Other runs: unchanged."""
    train = cfg.train
    if train == "full" or train.kind != "lora":
        return cfg
    update: dict[str, Any] = {}
    if train.init is not None:
        params, tensors = read_peft_dir(train.init)
        for field, key in (("rank", "rank"), ("alpha", "alpha"), ("target_modules", "targets")):
            given = getattr(train, field)
            have = list(params[key]) if key == "targets" else params[key]
            if given is not None and (sorted(given) if key == "targets" else given) != have:
                raise SeedLedgerError(f"train.{field} is {given!r}, but the adapter {train.init} has {have!r}")
            update[field] = have
        fp = fingerprint(tensors)
        if train.init_fingerprint not in (None, fp):
            raise SeedLedgerError(f"train.init {train.init} has fingerprint {fp}, not {train.init_fingerprint}")
        update["init_fingerprint"] = fp
    else:
        update = {"rank": train.rank or DEFAULT_RANK, "alpha": train.alpha or DEFAULT_ALPHA,
                  "init_seed": cfg.seed if train.init_seed is None else train.init_seed}
        if train.target_modules is None:
            from seedledger.replay.perturbation import DEFAULT_TARGETS

            update["target_modules"] = list(DEFAULT_TARGETS)
    return cfg.model_copy(update={"train": train.model_copy(update=update)})
