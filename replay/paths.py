"""Vectors the size of the trained weights as replay state: the update rule `paths`.

Two policies keep such vectors, which no finite list of keys names, and so derive them by
replaying from the base (or an anchor) exactly like Adam's moments, in
`OptimizerState.buffers["path{j}"]` (zero before the first step):

- LM-MA-ES (`trainers/lmmaes.py`): m evolution paths, each a decayed sum of every earlier
  generation's weighted noise;
- a GA with several survivors (`trainers/ga.py`, `ga.survivors`): survivor k + 1 as its
  offset from the master (survivor 0).

A `paths` step records in its optimizer dict, besides ``name: paths``:

- ``move``: m numbers, the master's move along the paths;
- either ``decay`` and ``gain`` (m numbers each: the paths decay and take g) or ``mix``
  (m rows of m numbers) and ``noise`` (m rows of one rounded coefficient per member):
  the paths are recombined from the old ones and the generation's noise;
- ``shrink``: α, the factor on every member's own noise;
- ``members``: per member (member order) m path coefficients bᵢⱼ (rounded).

Per trained tensor, with g = Σᵢ cᵢ·εᵢ (the SGD kernel's sum, from −0.0 as SGD's: θ + g is
the SGD step bit for bit):

    θ  = θ + g;  θ = θ + M₀·move₀;  …;  θ = θ + Mₘ₋₁·moveₘ₋₁     (the paths before the step)
    Mⱼ = Mⱼ·decayⱼ + g·gainⱼ                                      (decay/gain), or
    Mⱼ = ((+0.0 + M₀·mixⱼ₀) + … + Mₘ₋₁·mixⱼ,ₘ₋₁) + Σᵢ noiseⱼᵢ·εᵢ    (mix/noise; old paths, zero
                                                                  terms skipped)

and member i, evaluated before the step, is cast((θ + round(signᵢ·σ·α)·εᵢ) + M₀·bᵢ₀ + …),
the sum in fp32 in that order (`member_tensor`; the noise term only when its scale is
non-zero). Every op is one fp32 IEEE op with fp32 scalars (each number
rounded once from its float64 record), so CPU and CUDA give the same bits; the numbers
themselves come from the policy's float64 arithmetic (dot products of the paths, for
LM-MA-ES), which is why they are recorded rather than recomputed: replay never takes a
dot product.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from seedledger.ledger.errors import SeedLedgerError

from .noise import check_coefficient, generate, perturb_, tensor_key

NAME = "paths"
MAX_PATHS = 257  # lmmaes.memory ≤ 256, plus p_σ: a record may not ask for more buffers
FP32_MAX = float(np.finfo(np.float32).max)


def kind(j: int) -> str:
    """The `OptimizerState.buffers` kind of path j."""
    return f"path{j}"


def _f32(x: float) -> float:
    return float(np.float32(x))


def _numbers(opt: Mapping[str, Any], field: str, index: int, m: int | None = None,
             limit: int | None = MAX_PATHS) -> list[float]:
    values = opt.get(field)
    if not isinstance(values, list | tuple) or (m is not None and len(values) != m):
        want = f"a list of {m} numbers" if m is not None else "a list of numbers"
        raise SeedLedgerError(f"generation {index}: optimizer paths needs {field!r} as {want}")
    if limit is not None and len(values) > limit:
        raise SeedLedgerError(f"generation {index}: optimizer paths: {field!r} has {len(values)} entries, "
                              f"more than {limit}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not -FP32_MAX <= v <= FP32_MAX:
            raise SeedLedgerError(f"generation {index}: optimizer paths: {field!r} holds {str(v)[:40]}, "
                                  "not a finite fp32 number")
        out.append(_f32(v))
    return out


@dataclass(frozen=True)
class Rule:
    """A recorded `paths` step as fp32 scalars (`settings`): the paths either decay and take
    g (`decay`, `gain`) or are recombined (`mix`, `noise`); the other pair is empty."""

    move: tuple[float, ...]
    decay: tuple[float, ...] = ()
    gain: tuple[float, ...] = ()
    mix: tuple[tuple[float, ...], ...] = ()
    noise: tuple[tuple[float, ...], ...] = ()

    @property
    def memory(self) -> int:
        return len(self.move)


def _rows(opt: Mapping[str, Any], name: str, index: int, rows: int, width: int | None,
          limit: int | None = MAX_PATHS) -> list[list[float]]:
    values = opt.get(name)
    if not isinstance(values, list | tuple) or len(values) != rows:
        raise SeedLedgerError(f"generation {index}: optimizer paths needs {name!r} as {rows} rows")
    out = [_numbers({name: row}, name, index, width, limit) for row in values]
    if width is None and len({len(row) for row in out}) > 1:
        raise SeedLedgerError(f"generation {index}: optimizer paths: {name!r} rows differ in length")
    return out


def settings(opt: Mapping[str, Any], index: int, members: int | None = None) -> Rule:
    """The `Rule` of a recorded `paths` optimizer dict (`members`: the generation's member
    count, which every `noise` row must match); SeedLedgerError (one line) when malformed."""
    move = _numbers(opt, "move", index)
    m = len(move)
    if not m:
        raise SeedLedgerError(f"generation {index}: optimizer paths needs at least one path")
    decaying, mixing = "decay" in opt or "gain" in opt, "mix" in opt or "noise" in opt
    if decaying == mixing:
        raise SeedLedgerError(f"generation {index}: optimizer paths needs either 'decay' and 'gain' "
                              "or 'mix' and 'noise'")
    if decaying:
        return Rule(tuple(move), decay=tuple(_numbers(opt, "decay", index, m)),
                    gain=tuple(_numbers(opt, "gain", index, m)))
    noise = _rows(opt, "noise", index, m, members, limit=None)  # one coefficient per member
    for row in opt["noise"]:
        for c in row:
            try:
                check_coefficient(float(c))
            except ValueError as exc:
                raise SeedLedgerError(f"generation {index}: optimizer paths 'noise': {exc}") from None
    mix = _rows(opt, "mix", index, m, m)
    return Rule(tuple(move), mix=tuple(map(tuple, mix)), noise=tuple(map(tuple, noise)))


def member_settings(opt: Mapping[str, Any], index: int, member: int) -> tuple[float, list[float]]:
    """(α, member `member`'s path coefficients) of a recorded `paths` optimizer dict (the
    rest of the rule is `settings`' to check: this runs once per member)."""
    m = len(_numbers(opt, "move", index))
    shrink = opt.get("shrink")
    if isinstance(shrink, bool) or not isinstance(shrink, int | float) or not 0.0 < shrink <= 1.0:
        raise SeedLedgerError(f"generation {index}: optimizer paths needs 'shrink' in (0, 1], got {shrink!r}")
    rows = opt.get("members")
    if not isinstance(rows, list | tuple) or not 0 <= member < len(rows):
        raise SeedLedgerError(f"generation {index}: optimizer paths records no path coefficients for member {member}")
    return float(shrink), _numbers({"b": rows[member]}, "b", index, m)


def apply(items: Sequence[tuple[str, torch.Tensor]], state: Any, rule: Rule,
          delta: Callable[[str, torch.Tensor, Sequence[float] | None], torch.Tensor]) -> None:
    """One `paths` step on the trained tensors `items` (name, fp32 master), in place.
    `delta(name, theta, coefficients)` is Σᵢ cᵢ·εᵢ for that tensor (replay's SGD kernel
    from −0.0), the generation's recorded coefficients when `coefficients` is None."""
    for name, theta in items:
        g = delta(name, theta, None)
        paths = [state.buffer(kind(j), name, theta) for j in range(rule.memory)]
        fresh = [_recombined(paths, mix, delta(name, theta, noise)) for mix, noise in zip(rule.mix, rule.noise,
                                                                                          strict=True)]
        theta.add_(g)
        for path, mv in zip(paths, rule.move, strict=True):
            if mv != 0.0:
                theta.add_(torch.mul(path, mv))
        if rule.decay:
            for path, dc, gn in zip(paths, rule.decay, rule.gain, strict=True):
                path.mul_(dc)
                path.add_(torch.mul(g, gn))
        else:
            for path, new in zip(paths, fresh, strict=True):  # after every read of the old paths
                path.copy_(new)
    j = rule.memory
    while rule.mix and kind(j) in state.buffers:  # a fork to fewer survivors, an LM-MA-ES parent's: gone
        del state.buffers[kind(j)]
        j += 1


def _recombined(paths: Sequence[torch.Tensor], mix: Sequence[float], noise: torch.Tensor) -> torch.Tensor:
    """(+0.0 + Σₗ pathsₗ·mixₗ, zero terms skipped) + noise, a fresh tensor."""
    out = torch.zeros_like(noise)
    for path, x in zip(paths, mix, strict=True):
        if x != 0.0:
            out.add_(torch.mul(path, x))
    return out.add_(noise)


def member_tensor(master: torch.Tensor, name: str, key: int, scale: float, coefficients: Sequence[float],
                  state: Any) -> torch.Tensor:
    """Member tensor `name` in fp32, a fresh tensor: (master + scale·ε(key)) + its path terms
    (`scale` rounded; 0 adds no noise, so an elite keeps the master's bits, −0.0 included).
    The one definition the backends evaluate (adapters, full-rank members) and
    `replay.rebuild.apply_member` reproduces."""
    out = perturb_(torch.empty_like(master), master, tensor_key(key, name), scale) if scale != 0.0 else master.clone()
    return member_(out, name, state, coefficients)


def member_(out: torch.Tensor, name: str, state: Any, coefficients: Sequence[float]) -> torch.Tensor:
    """Add member's path terms to `out` (its perturbed fp32 tensor `name`) in path order."""
    for j, b in enumerate(coefficients):
        b32 = _f32(b)
        path = state.buffers.get(kind(j), {}).get(name) if b32 != 0.0 else None  # no state needed for zeros
        if path is not None:
            out.add_(torch.mul(path.to(out.device), b32))
    return out


def _stacked(state: Any, name: str, m: int) -> torch.Tensor | None:
    """Paths 0..m-1 of tensor `name` as one [m, numel] float64 CPU matrix (an absent path
    is zeros); None when the tensor has none yet."""
    rows = [state.buffers.get(kind(j), {}).get(name) for j in range(m)]
    if all(r is None for r in rows):
        return None
    like = next(r for r in rows if r is not None)
    return torch.stack([(r if r is not None else torch.zeros_like(like)).detach().reshape(-1).cpu().double()
                        for r in rows])


def gram(state: Any, names: Sequence[str], m: int) -> list[list[float]]:
    """Mⱼ·Mₖ (j, k < m) over the tensors `names`, float64 on the CPU, one tensor at a time."""
    total = torch.zeros(m, m, dtype=torch.float64)
    for name in names:
        p = _stacked(state, name, m)
        if p is not None:
            total += p @ p.T
    return total.tolist()


def projections(state: Any, names: Sequence[str], shapes: Mapping[str, int], keys: Sequence[int],
                m: int) -> list[list[float]]:
    """Mⱼ·ε(keyᵢ) for every key i and j < m over the tensors `names` (numel by `shapes`),
    float64 on the CPU: per tensor, its paths stacked once against all keys' noise."""
    total = torch.zeros(len(keys), m, dtype=torch.float64)
    for name in names:
        p = _stacked(state, name, m)
        if p is None or not keys:
            continue
        eps = torch.stack([generate(tensor_key(key, name), shapes[name]).double() for key in keys])
        total += eps @ p.T
    return total.tolist()


class StateView:
    """The replay state as LM-MA-ES reads it (`trainers.lmmaes.PathView`): the paths over
    `master`'s tensors that `trained` selects."""

    def __init__(self, master: Mapping[str, torch.Tensor], state: Any, trained: Callable[[str, Any], bool]):
        self.names = [n for n, t in master.items() if trained(n, t.shape)]
        self.shapes = {n: master[n].numel() for n in self.names}
        self.dimension = sum(self.shapes.values())
        self.state = state
        self.steps = state.step if state.name == NAME else 0

    def gram(self, m: int) -> list[list[float]]:
        return gram(self.state, self.names, m)

    def projections(self, keys: Sequence[int], m: int) -> list[list[float]]:
        return projections(self.state, self.names, self.shapes, keys, m)


__all__ = [
    "NAME", "Rule", "StateView", "apply", "gram", "kind", "member_", "member_settings", "member_tensor", "projections",
    "settings",
]
