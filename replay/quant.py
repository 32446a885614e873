"""Int8 weight-only quantization as replay sees it: pure functions of fp32 tensors.

The format is symmetric, per output channel (row) of a linear weight W [out, in]:

    a_r = max_j |W_rj|                 (exact)
    s_r = a_r / 127  (1.0 when a_r = 0) (one IEEE fp32 division)
    Q_rj = clamp(round_half_even(W_rj / s_r), -127, 127) as int8
    W ≈ diag(s)·Q

No zero point: the grid is symmetric, so there is none to train. Every step is one
correctly rounded IEEE op on fp32 values, and it always runs on the CPU, so the same base
gives the same codes and scales on every machine, whatever device trains. In a master the
codes keep the weight's name (``M.weight``, int8) and the scales sit beside them
(``M.weight_scale``, fp32 [out]), as compressed-tensors names them, so a quantized master
is written out as a checkpoint without renaming (``engine.rebuild.output``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

CODE_MAX = 127
CODE_DTYPE = torch.int8
SCALE_SUFFIX = "_scale"  # M.weight -> M.weight_scale


def scale_name(weight: str) -> str:
    """The name of the scales beside the codes named ``weight``."""
    return weight + SCALE_SUFFIX


def weight_name(scale: str) -> str:
    """The codes' name for scales named ``scale``."""
    return scale[: -len(SCALE_SUFFIX)]


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes [out, in], fp32 scales [out]) of the 2-D fp32 weight ``w``, computed on
    the CPU and returned on ``w``'s device."""
    if w.dim() != 2 or w.dtype != torch.float32:
        raise ValueError(f"int8 row quantization takes a 2-D fp32 weight, not {tuple(w.shape)} {w.dtype}")
    cpu = w.detach().to("cpu")
    absmax = cpu.abs().amax(dim=1)
    scale = torch.where(absmax > 0, absmax / CODE_MAX, torch.ones_like(absmax))
    codes = torch.round(cpu / scale.view(-1, 1)).clamp_(-CODE_MAX, CODE_MAX).to(CODE_DTYPE)
    return codes.to(w.device).contiguous(), scale.to(w.device).contiguous()


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """diag(scale)·codes in fp32 (one rounded product per element)."""
    return codes.to(torch.float32) * scale.to(torch.float32).view(-1, 1)


def is_quantized(master: Mapping[str, torch.Tensor], weight: str) -> bool:
    """Does ``master`` hold ``weight`` as int8 codes with its scales beside them?"""
    return master[weight].dtype == CODE_DTYPE and scale_name(weight) in master


def quantized_view(master: Mapping[str, torch.Tensor], picks: Callable[[str, tuple[int, ...]], bool],
                   ) -> dict[str, torch.Tensor]:
    """A new dict in ``master``'s order: every fp32 weight ``picks`` names replaced by its
    codes, its scales right after it; tensors already quantized, and the rest, as they are
    (shared, not copied). ``master`` itself is not changed."""
    out: dict[str, torch.Tensor] = {}
    for name, t in master.items():
        if name.endswith(SCALE_SUFFIX) and weight_name(name) in master:
            continue  # placed right after its codes
        if t.dtype == CODE_DTYPE:
            out[name] = t
            out[scale_name(name)] = master[scale_name(name)]
        elif t.dim() == 2 and picks(name, tuple(t.shape)):
            out[name], out[scale_name(name)] = quantize_rows(t)
        else:
            out[name] = t
    return out


def quantize_master_(master: dict[str, torch.Tensor], picks: Callable[[str, tuple[int, ...]], bool]) -> bool:
    """Make ``master`` its ``quantized_view``, in place (the dict's keys change; tensors
    that stay are the same objects). Returns whether anything was quantized."""
    view = quantized_view(master, picks)
    if list(view) == list(master):
        return False
    master.clear()
    master.update(view)
    return True


def quantized_names(names: Mapping[str, tuple[int, ...]], picks: Callable[[str, tuple[int, ...]], bool]) -> list[str]:
    """The tensor names a master with tensors ``names`` (name -> shape) has once quantized."""
    out: list[str] = []
    for name, shape in names.items():
        if name.endswith(SCALE_SUFFIX) and weight_name(name) in names:
            continue
        out.append(name)
        if len(shape) == 2 and picks(name, shape):
            out.append(scale_name(name))
    return out


def model_weights(master: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What a model's parameters hold for a quantized master: codes as fp32 integers
    (exact in every float dtype) under the weight's name, every other tensor as it is;
    the scales are left out (the evaluation multiplies the matmul's output by them)."""
    return {name: t.to(torch.float32) if t.dtype == CODE_DTYPE else t
            for name, t in master.items() if not (name.endswith(SCALE_SUFFIX) and weight_name(name) in master)}


def dequantized(master: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The fp32 weights a quantized master stands for (diag(s)·Q per quantized linear)."""
    return {name: dequantize(t, master[scale_name(name)]) if t.dtype == CODE_DTYPE else t
            for name, t in master.items() if not (name.endswith(SCALE_SUFFIX) and weight_name(name) in master)}
