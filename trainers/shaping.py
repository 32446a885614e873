"""Reward shaping and ranking, in one place: what the policies turn rewards into before
their coefficients (ES's `shaping`, CMA-ES's and LM-MA-ES's `ranking`) and the ranks
`attribute` correlates.

- `zscore`: (r − mean)/std; `centered_rank`: ranks mapped to [−0.5, 0.5], ties sharing
  their mean rank (`mean_ranks`, the one rank function); `difference`: (r − mean)/σ;
  `ranking`: member indices best first, ties by index.
- ``pareto`` (below): reward components as separate objectives, ranked as NSGA-II ranks
  them, so no weighted sum decides how much of one is worth how much of another.

Objectives: each reward function of the task with a nonzero weight, as
``weight × component`` (so a negative weight is minimised; the size of a weight does not
matter, only its sign); a component a member lacks (None) is −∞ there. Zero-weight
components (recorded diagnostics such as code's ``timeouts``) are not objectives.

1. Fronts (non-dominated sorting, maximising): front 0 holds the members no other member
   dominates (at least as good in every objective, better in one); front k those only
   members of fronts < k dominate.
2. Crowding distance within each front, over its *distinct* objective vectors (members
   with equal vectors share one distance, whatever their order): per objective, the
   vectors sorted by (value, whole vector); the two ends get +∞, the others the gap
   between their neighbours over the front's range in that objective, summed over the
   objectives in task order. An objective with an equal or non-finite value range in
   the front adds nothing.
3. Shaped value: the centered rank of (front ascending, crowding descending) mapped to
   [−0.5, 0.5], the best member 0.5; members with the same front and crowding share their
   mean rank. So the result depends only on the members' objective vectors, never on
   member order, and with one objective it equals ``centered_rank``.

Each member's front is recorded with its components as ``pareto_front`` (0 = best).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

Shaping = Literal["zscore", "centered_rank", "difference", "pareto"]

FRONT = "pareto_front"
"""The component name under which each member's front is recorded."""


def zscore(rewards: list[float]) -> list[float]:
    """(r − mean) / std; all zeros when the rewards carry no signal."""
    n = len(rewards)
    mean = sum(rewards) / n
    var = sum((r - mean) ** 2 for r in rewards) / n
    std = math.sqrt(var)
    if std < 1e-12:
        return [0.0] * n
    return [(r - mean) / std for r in rewards]


def differences(rewards: list[float], sigma: float) -> list[float]:
    """(r − mean)/σ: raw fitness differences, no normalisation. With mirrored pairs a pair's
    coefficient is α·(r₊ − r₋)/(Nσ): MeZO's projected gradient (L₊ − L₋)/2σ averaged over
    the N/2 pairs (Malladi et al. 2023). Dense fitness only: the step grows with the
    rewards' scale, and ties give 0."""
    mean = sum(rewards) / len(rewards)
    return [(r - mean) / sigma for r in rewards]


def mean_ranks(values: Sequence[Any]) -> list[float]:
    """Each value's rank in ascending order (0 = smallest); ties share their mean rank, so
    the result never depends on the values' order."""
    n = len(values)
    order = sorted(range(n), key=lambda i: values[i])
    ranks = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def centered_ranks(values: Sequence[Any]) -> list[float]:
    """Ranks mapped to [−0.5, 0.5] (the largest 0.5); ties share their mean rank."""
    n = len(values)
    if n == 1:
        return [0.0]
    return [r / (n - 1) - 0.5 for r in mean_ranks(values)]


def ranking(rewards: Sequence[float]) -> list[int]:
    """Member indices best first; ties by member index."""
    return sorted(range(len(rewards)), key=lambda i: (-rewards[i], i))


def shape(
    shaping: Shaping, rewards: list[float], sigma: float, components: Sequence[dict[str, float | None]] | None = None,
    objectives: Mapping[str, float] | None = None,
) -> list[float]:
    """Shaped rewards. `difference` divides by `sigma`, the σ in force; `pareto` ranks the
    `components` as objectives (`objectives` maps each component to its weight, default 1
    for every component) and writes each member's front into its components dict as
    `pareto_front`."""
    if shaping == "zscore":
        return zscore(rewards)
    if shaping == "centered_rank":
        return centered_ranks(rewards)
    if shaping == "difference":
        return differences(rewards, sigma)
    if components is None or len(components) != len(rewards):
        raise ValueError("pareto shaping needs each member's reward components")
    if objectives is None:
        objectives = {n: 1.0 for c in components for n in c if n != FRONT}
    shaped, front = pareto_shape(objective_vectors(components, objectives))
    for comp, f in zip(components, front, strict=True):
        comp[FRONT] = float(f)
    return shaped


def objective_vectors(
    components: Sequence[Mapping[str, float | None]], weights: Mapping[str, float]
) -> list[tuple[float, ...]]:
    """``weight × component`` per member for every nonzero weight (None → −∞)."""
    names = [n for n, w in weights.items() if w]
    out = []
    for comp in components:
        row = []
        for n in names:
            v = comp.get(n)
            row.append(-math.inf if v is None or math.isnan(v) else weights[n] * float(v))
        out.append(tuple(row))
    return out


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x >= y for x, y in zip(a, b, strict=True)) and any(x > y for x, y in zip(a, b, strict=True))


def fronts(points: Sequence[Sequence[float]]) -> list[int]:
    """Each point's front index (0 = non-dominated), by NSGA-II's fast non-dominated sort."""
    n = len(points)
    beats: list[list[int]] = [[] for _ in range(n)]
    beaten = [0] * n
    for i in range(n):
        for j in range(n):
            if i != j and dominates(points[i], points[j]):
                beats[i].append(j)
                beaten[j] += 1
    front = [-1] * n
    current = [i for i in range(n) if beaten[i] == 0]
    k = 0
    while current:
        nxt = []
        for i in current:
            front[i] = k
            for j in beats[i]:
                beaten[j] -= 1
                if beaten[j] == 0:
                    nxt.append(j)
        current, k = nxt, k + 1
    return front


def crowding(points: Sequence[Sequence[float]], front: Sequence[int]) -> list[float]:
    """Each point's crowding distance within its front (see the module doc)."""
    dist = [0.0] * len(points)
    for k in set(front):
        members = [i for i in range(len(points)) if front[i] == k]
        vectors = sorted({tuple(points[i]) for i in members})
        d = dict.fromkeys(vectors, 0.0)
        m = len(vectors[0]) if vectors else 0
        for obj in range(m):
            order = sorted(vectors, key=lambda v, o=obj: (v[o], v))
            lo, hi = order[0][obj], order[-1][obj]
            if not (math.isfinite(lo) and math.isfinite(hi)) or hi == lo:
                continue
            d[order[0]] = d[order[-1]] = math.inf
            for a, v, b in zip(order, order[1:], order[2:], strict=False):
                d[v] += (b[obj] - a[obj]) / (hi - lo)
        if len(vectors) <= 2:
            d = dict.fromkeys(vectors, math.inf)
        for i in members:
            dist[i] = d[tuple(points[i])]
    return dist


def pareto_shape(points: Sequence[Sequence[float]]) -> tuple[list[float], list[int]]:
    """(shaped value per point in [−0.5, 0.5], front per point)."""
    n = len(points)
    front = fronts(points)
    if n == 1:
        return [0.0], front
    dist = crowding(points, front)
    key = [(-front[i], dist[i]) for i in range(n)]  # larger is better
    return centered_ranks(key), front


__all__ = ["FRONT", "Shaping", "centered_ranks", "differences", "mean_ranks", "pareto_shape", "ranking", "shape",
           "zscore"]
