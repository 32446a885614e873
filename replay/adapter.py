"""LoRA adapters as the trained parameters: the spec a run stores and the initial adapter.

An adapter run trains only a LoRA adapter on a frozen base. Its master is the adapter
itself, fp32 tensors named as PEFT saves them (``base_model.model.<module>.lora_A.weight``
[r, in] and ``....lora_B.weight`` [out, r] for every targeted linear ``<module>``), so the
update, optimizer state, fingerprints and anchors of ``replay`` apply to it unchanged:
member noise is spec v1 full-rank noise on the adapter tensors (they are small, and PEFT
trains every entry of both factors). The model a run describes is W + (alpha/r)·B·A on
every targeted linear of the frozen base.

The run stores the spec as its ``param_selection`` (noise spec ``v1``), canonical:

    lora-v1:r=R,alpha=ALPHA,init=INIT,targets=t1,t2,...

- ALPHA is ``repr(float)``; the model's scale alpha/R is PEFT's ``lora_alpha / r``.
- INIT ``seed:N``: A from the noise table under a key of its own, scaled to PEFT's default
  initialisation variance, B = 0 (``initial_adapter``); ``peft:FP``: a PEFT adapter
  directory whose tensors have fingerprint FP (an SFT warm start; the engine loads it).
- targets: linear-module name suffixes, as PEFT's ``target_modules`` match them.

A: PEFT initialises lora_A with ``kaiming_uniform_(a=√5)``, i.e. U(−1/√in, 1/√in), of
variance 1/(3·in). Here A[i] = c·ε(key, i) with c = 1/√(3·in) rounded to 12 significant
bits, so c·ε is exact in fp32 (12 × 12 bits) and A is the same on every device; its
variance matches PEFT's (Gaussian rather than uniform entries).

Generation 0 of an adapter run is the frozen base *as loaded* (quantized weights
included) together with the initial adapter: ``start_fingerprint`` combines the two, and
the run's base fingerprint is that value, so a base loaded or quantized differently is
refused wherever a run is replayed.

ESSA (Evolutionary Strategies for Scalable Alignment, arXiv 2507.04453): ``essa-v1:...``,
same fields, ``init`` a PEFT adapter (the SFT warm start). The run trains only the
singular values of each module's B·A = U·diag(s)·Vᵀ (``singular_form``): its master holds,
per module, ``<module>.essa.s`` [r] (trained: perturbed and updated) and the fixed basis
``<module>.essa.U`` [out, r] and ``<module>.essa.Vt`` [r, in] (never perturbed or updated,
but fingerprinted with the master, so a basis computed differently is refused like a base
loaded differently). The model it describes is the plain LoRA B = U·diag(s), A = Vᵀ
(``peft_adapter``), which is also what it exports. A few thousand trained dimensions
instead of the adapter's 10⁵–10⁶: the setting ESSA runs CMA-ES in.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seedledger.ledger.errors import SeedLedgerError

from . import paths
from .fingerprint import fingerprint
from .hashing import MASK64, mix, stable_hash
from .noise import perturb_, round_coefficient, run_key, tensor_key

SPEC = "lora-v1"
ESSA_SPEC = "essa-v1"
PREFIX = "base_model.model."  # how PEFT names an adapter's tensors in its safetensors file
MAX_RANK = 4096
_TARGET = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")
_FP = re.compile(r"[0-9a-f]{32}")
_SELECTION = re.compile(r"(lora|essa)-v1:r=(\d+),alpha=([^,]+),init=(seed:\d+|peft:[0-9a-f]{32}),targets=(.+)")
_INIT_DOMAIN = stable_hash("seedledger/lora/v1/init")
_S, _U, _VT = ".essa.s", ".essa.U", ".essa.Vt"  # an ESSA master's tensors, per module
DEGENERATE = 1e-6  # s_r ≤ this·s_1: B·A is rank-deficient, its basis arbitrary (refused)


@dataclass(frozen=True)
class LoraSpec:
    """What an adapter run trains: rank, alpha, targeted linears, and where A, B start."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    init: str  # "seed:N" or "peft:<fingerprint>"
    essa: bool = False  # train only the singular values of the init adapter (see above)

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 1 <= self.rank <= MAX_RANK:
            raise SeedLedgerError(f"LoRA rank must be an integer in 1..{MAX_RANK}, not {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) \
                or not math.isfinite(self.alpha) or self.alpha <= 0:
            raise SeedLedgerError(f"LoRA alpha must be a positive finite number, not {self.alpha!r}")
        object.__setattr__(self, "alpha", float(self.alpha))
        targets = tuple(self.targets)
        if not targets or len(set(targets)) != len(targets):
            raise SeedLedgerError("LoRA target_modules must be a non-empty list without repeats")
        for t in targets:
            if not isinstance(t, str) or not _TARGET.fullmatch(t):
                raise SeedLedgerError(f"bad LoRA target module {_short(t)} (letters, digits, _ and inner dots)")
        object.__setattr__(self, "targets", targets)
        kind, _, value = str(self.init).partition(":")
        ok = (kind == "seed" and value.isdigit() and int(value) < 2**63) or (kind == "peft" and _FP.fullmatch(value))
        if not ok:
            raise SeedLedgerError(f"bad LoRA init {_short(self.init)} (seed:N or peft:<32 hex fingerprint>)")
        if self.essa and kind != "peft":
            raise SeedLedgerError("ESSA trains the singular values of an SFT adapter: its init must be a PEFT "
                                  "adapter directory (train.init), not a seeded one")

    @property
    def selection(self) -> str:
        """The run's ``param_selection`` (canonical)."""
        prefix = ESSA_SPEC if self.essa else SPEC
        return f"{prefix}:r={self.rank},alpha={self.alpha!r},init={self.init},targets={','.join(self.targets)}"

    @property
    def scale(self) -> float:
        """alpha / r, as PEFT computes ``scaling`` (evaluation and merging, never replay)."""
        return self.alpha / self.rank

    @property
    def init_seed(self) -> int | None:
        return int(self.init[5:]) if self.init.startswith("seed:") else None

    def trains(self, name: str) -> bool:
        """Is master tensor ``name`` perturbed and updated? (ESSA: the singular values only.)"""
        return not self.essa or name.endswith(_S)

    def matches(self, module: str) -> bool:
        """Is linear module ``module`` targeted? (PEFT's rule: the name or a dotted suffix.)"""
        return any(module == t or module.endswith(f".{t}") for t in self.targets)


def parse_selection(selection: str) -> LoraSpec:
    """The spec of a stored ``param_selection``; one-line SeedLedgerError unless canonical."""
    m = _SELECTION.fullmatch(selection)
    if m is None:
        raise SeedLedgerError(f"bad LoRA parameter selection {_short(selection)} "
                              f"(lora-v1|essa-v1:r=R,alpha=A,init=seed:N|peft:FP,targets=NAME,...)")
    try:
        alpha = float(m.group(3))
    except ValueError:
        raise SeedLedgerError(f"bad LoRA alpha {_short(m.group(3))}") from None
    spec = LoraSpec(int(m.group(2)), alpha, tuple(m.group(5).split(",")), m.group(4), m.group(1) == "essa")
    if spec.selection != selection:
        raise SeedLedgerError(f"LoRA parameter selection {_short(selection)} is not canonical "
                              f"({spec.selection!r})")
    return spec


def is_selection(selection: str) -> bool:
    return selection.startswith((f"{SPEC}:", f"{ESSA_SPEC}:"))


def tensor_names(module: str) -> tuple[str, str]:
    """(lora_A, lora_B) master names of targeted linear ``module`` (PEFT's file names)."""
    return f"{PREFIX}{module}.lora_A.weight", f"{PREFIX}{module}.lora_B.weight"


def essa_names(module: str) -> tuple[str, str, str]:
    """(s, U, Vt) master names of an ESSA run's targeted linear ``module``."""
    return f"{PREFIX}{module}{_S}", f"{PREFIX}{module}{_U}", f"{PREFIX}{module}{_VT}"


def singular_form(adapter: Mapping[str, torch.Tensor], modules: list[str]) -> dict[str, torch.Tensor]:
    """An ESSA master from a plain adapter: B·A = U·diag(s)·Vᵀ per module, in float64.

    Thin QRs of B and Aᵀ and the SVD of the r×r product of their R factors give the
    factors without forming the out×in product. Signs are made canonical (each column
    of U has its largest-magnitude entry positive; ties: the first), then everything is
    rounded to fp32. LAPACK is deterministic for one build; across builds the basis may
    differ in the last bit, which the master's fingerprint (the basis is in it) turns into
    a refusal rather than a silent drift.
    """
    master: dict[str, torch.Tensor] = {}
    for module in modules:
        a_name, b_name = tensor_names(module)
        a, b = adapter[a_name].double().cpu(), adapter[b_name].double().cpu()  # [r, in], [out, r]
        rank = a.shape[0]
        if rank > min(a.shape[1], b.shape[0]):
            raise SeedLedgerError(f"ESSA: module {module!r} has rank {rank} > min(out, in) = "
                                  f"{min(a.shape[1], b.shape[0])}: its singular form is not unique")
        q_b, r_b = torch.linalg.qr(b)
        q_a, r_a = torch.linalg.qr(a.T)
        u, sv, vh = torch.linalg.svd(r_b @ r_a.T)
        if not bool(sv[-1] > DEGENERATE * sv[0]):
            raise SeedLedgerError(f"ESSA: B·A of module {module!r} has rank < {rank} (singular values "
                                  f"{sv[0].item():.3g} … {sv[-1].item():.3g}), so its singular vectors are "
                                  "arbitrary: start from a trained (SFT) adapter of full rank")
        big_u, big_v = q_b @ u, q_a @ vh.T  # [out, r], [in, r]
        pivot = big_u.abs().argmax(dim=0)
        sign = torch.where(big_u[pivot, torch.arange(rank)] < 0, -1.0, 1.0).to(torch.float64)
        device = adapter[a_name].device
        for name, t in zip(essa_names(module), (sv, big_u * sign, (big_v * sign).T), strict=True):
            master[name] = t.float().contiguous().to(device)
    return master


def essa_modules(master: Mapping[str, torch.Tensor]) -> list[str]:
    """The modules of an ESSA master, in its order."""
    return [n[len(PREFIX) : -len(_S)] for n in master if n.startswith(PREFIX) and n.endswith(_S)]


def peft_adapter(spec: LoraSpec, master: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The plain LoRA tensors (PEFT names) a master describes: itself, or for ESSA
    B = U·diag(s) and A = Vᵀ (new tensors; the master is never written)."""
    if not spec.essa:
        return dict(master)
    out: dict[str, torch.Tensor] = {}
    for module in essa_modules(master):
        s_name, u_name, vt_name = essa_names(module)
        a_name, b_name = tensor_names(module)
        out[a_name] = master[vt_name]
        out[b_name] = master[u_name] * master[s_name]
    return out


def member_adapter(spec: LoraSpec, master: Mapping[str, torch.Tensor], key: int | None,
                   scale: float, path_terms: Sequence[float] = (), state: Any = None) -> dict[str, torch.Tensor]:
    """A member's plain LoRA tensors: the master's trained tensors as (t + scale·ε(key)) plus
    a member's `path_terms` along `state`'s paths (`replay.paths.member_tensor`, what
    `replay.rebuild.apply_member` builds; LM-MA-ES, GA survivors), the rest shared, then
    `peft_adapter`. Key None or scale 0 and no path terms: the master itself. The one
    definition both backends evaluate."""
    noise = key is not None and scale != 0.0
    along = any(b != 0.0 for b in path_terms)
    if noise or along:
        out = {}
        for n, t in master.items():
            if spec.trains(n):
                t = paths.member_tensor(t, n, key, scale if noise else 0.0, path_terms, state)
            out[n] = t
        master = out
    return peft_adapter(spec, master)


def init_scale(in_features: int) -> float:
    """c = 1/√(3·in) to 12 significant bits: A = c·ε has PEFT's lora_A variance, exactly."""
    return round_coefficient(1.0 / math.sqrt(3.0 * int(in_features)))


def init_key(seed: int) -> int:
    """The key under which the initial A of a run seeded ``seed`` is drawn."""
    return mix(run_key(seed), _INIT_DOMAIN) & MASK64


def initial_adapter(spec: LoraSpec, linears: Mapping[str, tuple[int, int]],
                    device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The seeded initial adapter: A = c·ε, B = 0 for every (module, (out, in)) in order.

    ``linears`` are the targeted modules (the engine finds them in the model). A run with
    a ``peft:`` init starts from its adapter directory instead (ValueError here).
    """
    seed = spec.init_seed
    if seed is None:
        raise ValueError(f"{spec.init} is not a seeded initialisation")
    key = init_key(seed)
    master: dict[str, torch.Tensor] = {}
    for module, (out_f, in_f) in linears.items():
        a_name, b_name = tensor_names(module)
        zeros = torch.zeros(spec.rank, in_f, dtype=torch.float32, device=device)
        master[a_name] = perturb_(torch.empty_like(zeros), zeros, tensor_key(key, a_name), init_scale(in_f))
        master[b_name] = torch.zeros(out_f, spec.rank, dtype=torch.float32, device=device)
    return master


def check_adapter(spec: LoraSpec, master: Mapping[str, torch.Tensor],
                  linears: Mapping[str, tuple[int, int]], source: str) -> None:
    """Refuse (one line) an adapter whose tensors are not exactly the spec's on ``linears``."""
    want: dict[str, tuple[int, int]] = {}
    for module, (out_f, in_f) in linears.items():
        a_name, b_name = tensor_names(module)
        want[a_name], want[b_name] = (spec.rank, in_f), (out_f, spec.rank)
    extra = sorted(set(master) - set(want))
    missing = sorted(set(want) - set(master))
    if extra or missing:
        what = f"unexpected tensor {extra[0]!r}" if extra else f"no tensor {missing[0]!r}"
        raise SeedLedgerError(f"{source}: {what} (LoRA r={spec.rank} on {', '.join(spec.targets)})")
    for name, shape in want.items():
        t = master[name]
        if tuple(t.shape) != shape:
            raise SeedLedgerError(f"{source}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")


def start_fingerprint(master: Mapping[str, torch.Tensor], frozen: str | None = None) -> str:
    """Generation 0's fingerprint: the master's, or for an adapter run (``frozen``: the
    fingerprint of the frozen base as loaded) both together."""
    if frozen is None:
        return fingerprint(master)
    h = hashlib.blake2b(b"seedledger/adapter-start/v1", digest_size=16)
    h.update(frozen.encode() + b"\0" + fingerprint(master).encode())
    return h.hexdigest()


def _short(x: object) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."
