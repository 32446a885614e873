"""Perturbation kinds: which tensors a run trains and what shape their noise takes.

A run stores two strings, ``noise_spec`` and ``param_selection``; every replay step
carries its own run's pair, so a fork may change kind (not the adapter). The forms:

- full: ``"v1"`` / ``"all"``. Every tensor is trained; member noise is ε from the v1
  counter noise (``replay.noise``).
- adapter: ``"v1"`` / ``"lora-v1:r=R,alpha=A,init=...,targets=..."``. The master is a
  LoRA adapter on a frozen base (``replay.adapter``) and every adapter tensor is trained
  with v1 noise: a full perturbation of a smaller master (``adapter`` is set).
- lowrank: ``"lowrank-v1:r=R"`` / ``"suffix:q_proj,k_proj,..."``. Only 2-D tensors named
  ``<target>.weight`` (or ``....<target>.weight``) for a listed target are trained, with
  noise E = A·Bᵀ/√R (``replay.lowrank``); everything else (embeddings, norms, lm_head) is
  frozen: no noise, no update, no optimizer state. R ∈ {1, 4, 16, 64}, so 1/√R is a power
  of two and scaling by it is exact.

Low-rank factors of member key k for tensor ``name`` of shape (out, in), rank R, are v1
counter noise under keys of their own (``factors``; ``stacked_factors`` for K members):

  key_A = mix(tensor_key(k, name), stable_hash("seedledger/lowrank/v1/A")),  A[o, r] = ε(key_A, o·R + r)
  key_B = mix(tensor_key(k, name), stable_hash("seedledger/lowrank/v1/B")),  B[i, r] = ε(key_B, i·R + r)

so E_k = A·Bᵀ/√R; the exact update with them is ``replay.lowrank``.

Stored strings must be canonical (``from_run`` refuses any pair that does not print back
identically), so one perturbation has exactly one spelling in a ledger or a seed file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Literal

import numpy as np
import torch

from seedledger.ledger.errors import SeedLedgerError

from . import _reference as ref
from .adapter import LoraSpec, is_selection, parse_selection
from .hashing import GOLDEN, MASK64, MIX1, MIX2, fmix64, mix, stable_hash
from .noise import _use_fast, _use_triton, generate, tensor_key
from .table import TABLE_NP

RANKS = (1, 4, 16, 64)
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KNOWN_SPECS = ("v1",) + tuple(f"lowrank-v1:r={r}" for r in RANKS)
_LOWRANK = "lowrank-v1:r="
_SUFFIX = "suffix:"
_TARGET = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")
_A = stable_hash("seedledger/lowrank/v1/A")
_B = stable_hash("seedledger/lowrank/v1/B")


@dataclass(frozen=True)
class Perturbation:
    """The perturbation kind of a run: ``full``, or ``lowrank`` of ``rank`` on ``targets``;
    ``adapter`` set: the master is that LoRA adapter (kind ``full`` on its tensors)."""

    kind: Literal["full", "lowrank"] = "full"
    rank: int = 0
    targets: tuple[str, ...] = ()
    adapter: LoraSpec | None = None

    @classmethod
    def from_run(cls, noise_spec: str, param_selection: str) -> Perturbation:
        """Parse a run's stored strings; SeedLedgerError (one line) if unknown or not canonical."""
        return _parse(str(noise_spec), str(param_selection))

    @classmethod
    def lowrank(cls, rank: int, targets: Sequence[str] = DEFAULT_TARGETS) -> Perturbation:
        """A lowrank perturbation; rank must be 1, 4, 16 or 64 (1/√rank a power of two)."""
        if isinstance(rank, bool) or rank not in RANKS:
            raise SeedLedgerError(f"low-rank rank must be one of {', '.join(map(str, RANKS))}, not {rank!r}")
        targets = tuple(targets)
        if not targets or len(set(targets)) != len(targets):
            raise SeedLedgerError("low-rank targets must be a non-empty list without repeats")
        for t in targets:
            if not isinstance(t, str) or not _TARGET.fullmatch(t):
                raise SeedLedgerError(f"bad low-rank target {_short(t)} (letters, digits, _ and inner dots)")
        return cls("lowrank", rank, targets)

    @property
    def noise_spec(self) -> str:
        return "v1" if self.kind == "full" else f"{_LOWRANK}{self.rank}"

    @classmethod
    def lora(cls, spec: LoraSpec) -> Perturbation:
        """An adapter run: v1 noise on every tensor of the LoRA adapter ``spec``."""
        return cls(adapter=spec)

    @property
    def param_selection(self) -> str:
        if self.adapter is not None:
            return self.adapter.selection
        return "all" if self.kind == "full" else _SUFFIX + ",".join(self.targets)

    def trained(self, name: str, shape: Sequence[int]) -> bool:
        """Does this kind perturb and update tensor ``name``? (full: all; lowrank: targets;
        an adapter: what its spec trains, i.e. not an ESSA run's fixed basis)."""
        if self.adapter is not None:
            return self.adapter.trains(name)
        if self.kind == "full":
            return True
        return len(shape) == 2 and any(name == f"{t}.weight" or name.endswith(f".{t}.weight") for t in self.targets)

    @property
    def inv_sqrt_rank(self) -> float:
        """1/√rank, an exact power of two (ValueError for ``full``, which has no rank)."""
        if self.kind != "lowrank":
            raise ValueError("a full perturbation has no rank")
        return 2.0 ** -(self.rank.bit_length() // 2)  # rank = 4**k has bit_length 2k + 1


@lru_cache(maxsize=64)
def _parse(noise_spec: str, param_selection: str) -> Perturbation:
    if is_selection(param_selection):
        if noise_spec != "v1":
            raise SeedLedgerError(f"a LoRA adapter is perturbed with noise spec 'v1', not {_short(noise_spec)}")
        return Perturbation.lora(parse_selection(param_selection))
    if noise_spec == "v1":
        if param_selection != "all":
            raise SeedLedgerError(f"noise spec 'v1' trains every tensor: parameter selection must be 'all', "
                                  f"not {_short(param_selection)}")
        return Perturbation()
    if noise_spec not in KNOWN_SPECS:
        raise SeedLedgerError(f"unknown noise spec {_short(noise_spec)} (known: {', '.join(KNOWN_SPECS)})")
    if not param_selection.startswith(_SUFFIX):
        raise SeedLedgerError(f"noise spec {noise_spec!r} needs a parameter selection 'suffix:NAME,...', "
                              f"not {_short(param_selection)}")
    # canonical by construction: the spec is one of KNOWN_SPECS, and split/join round-trips
    return Perturbation.lowrank(int(noise_spec[len(_LOWRANK):]), param_selection[len(_SUFFIX):].split(","))


def check_spec(noise_spec: str, param_selection: str) -> Perturbation:
    """What seed-file import and rebuild call to refuse runs this replay cannot apply."""
    return Perturbation.from_run(noise_spec, param_selection)


def step_perturbation(step: Any) -> Perturbation:
    """The perturbation of one replay step (its run's strings; ``full`` when it has none,
    e.g. a GenerationRecord, whose own are None unless it was imported with a kind)."""
    spec, selection = getattr(step, "noise_spec", None), getattr(step, "param_selection", None)
    return Perturbation.from_run(spec or "v1", selection or "all")


def _short(x: object) -> str:
    """repr of untrusted text, cut to one short line."""
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


# --- low-rank factors ----------------------------------------------------------------


def factor_keys(member_key: int, name: str) -> tuple[int, int]:
    """(key_A, key_B) of one member's factors for tensor ``name``."""
    tk = tensor_key(member_key, name)
    return mix(tk, _A), mix(tk, _B)


def factors(member_key: int, name: str, shape: tuple[int, int], rank: int,
            device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A [out, R] and B [in, R] (fp32, row-major: A[o, r] is element o·R + r of key_A)."""
    rows, cols = check_matrix(shape, rank)
    ka, kb = factor_keys(member_key, name)
    return (generate(ka, rows * rank, device=device).view(rows, rank),
            generate(kb, cols * rank, device=device).view(cols, rank))


def stacked_factors(member_keys: Sequence[int], name: str, shape: tuple[int, int], rank: int,
                    device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """[K, out, R] and [K, in, R]: every member's ``factors`` at once (the batched forward's)."""
    rows, cols = check_matrix(shape, rank)
    keys = key_table(member_keys, [name])[0]
    dev = torch.device(device)
    return (_generate_many(keys[0], keys[1], rows * rank, dev).view(len(keys[0]), rows, rank),
            _generate_many(keys[2], keys[3], cols * rank, dev).view(len(keys[0]), cols, rank))


def key_table(member_keys: Sequence[int], names: Sequence[str]) -> np.ndarray:
    """[len(names), 4, K] uint64: key_A, kx_A, key_B, kx_B of every (tensor, member).

    ``factor_keys`` and ``noise_xkey`` vectorised: numpy uint64 arithmetic wraps like
    Python ints masked to 64 bits.
    """
    mk = np.array([int(k) & MASK64 for k in member_keys], dtype=np.uint64).reshape(1, -1)
    cn = np.array([_name_const(n) for n in names], dtype=np.uint64).reshape(-1, 1)
    tk = _fmix_np(mk ^ cn)
    ka, kb = _fmix_np(tk ^ np.uint64(fmix64(_A + GOLDEN))), _fmix_np(tk ^ np.uint64(fmix64(_B + GOLDEN)))
    salt = np.uint64(ref.NOISE_SALT)
    return np.stack([ka, _fmix_np(ka ^ salt), kb, _fmix_np(kb ^ salt)], axis=1)


@cache
def _name_const(name: str) -> int:
    return fmix64(stable_hash(name) + GOLDEN)  # tensor_key(k, name) = fmix64(k ^ this)


def _fmix_np(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
        return z ^ (z >> np.uint64(31))


def check_matrix(shape: Sequence[int], rank: int) -> tuple[int, int]:
    """(out, in) of a 2-D shape; ValueError for another shape or a rank not in RANKS."""
    if len(shape) != 2:
        raise ValueError(f"low-rank noise needs a 2-D tensor, not shape {tuple(shape)}")
    if rank not in RANKS:
        raise ValueError(f"rank must be one of {RANKS}, not {rank!r}")
    return int(shape[0]), int(shape[1])


def _generate_many(keys: np.ndarray, kxs: np.ndarray, n: int, device: torch.device) -> torch.Tensor:
    """[K, n] noise of keys (fast path by device, else the reference)."""
    if _use_fast(device):
        from . import _cpu_kernels as k

        out = np.empty((len(keys), n), dtype=np.float32)
        k.generate_many(keys, kxs, out, TABLE_NP)
        return torch.from_numpy(out)
    if _use_triton(device):
        from . import _triton_kernels as tk

        return tk.generate_many(torch.from_numpy(np.stack([keys, kxs]).view(np.int64)).to(device), n)
    return torch.stack([ref.noise_ref(int(k), n, 0, device) for k in keys]) if len(keys) else \
        torch.empty(0, n, device=device)
