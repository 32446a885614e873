"""pass@k as a training reward: k-of-n sampling per prompt, unbiased estimator.

With n samples of one prompt of which c succeed, pass@k = 1 − C(n−c, k) / C(n, k) (Chen et
al. 2021), computed as a stable product.

Used in training when the config has ``passk: {n, k[, threshold]}`` (with
``sampling.temperature > 0``): the evaluator (``engine/runtime/scoring/evaluator.py``) has the backend draw
n seeded samples of every prompt of the batch (prompt-major; sample s of prompt i seeded by
the member's seed, i and s), scores each with the task, and takes
``pass_at_k_rewards(scores, n, k, threshold)`` once per prompt; the member's reward is the
mean over prompts, recorded with the components ``pass@k`` and ``sample_reward``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class PassKSettings(Protocol):
    """The config's `passk` section as trainers read it (read-only: a validated section fits)."""

    @property
    def n(self) -> int: ...

    @property
    def k(self) -> int: ...

    @property
    def threshold(self) -> float | None: ...


def samples_per_prompt(spec: PassKSettings | None) -> int:
    """How many completions each prompt gets: pass@k's n (`passk` config), else 1."""
    return spec.n if spec is not None else 1


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for ``c`` successes among ``n`` samples (``1 ≤ k ≤ n``)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    prob_all_fail = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_fail *= 1.0 - k / i
    return 1.0 - prob_all_fail


def pass_at_k_rewards(
    rewards: Sequence[float], n: int, k: int, threshold: float = 1.0
) -> list[float]:
    """Each sample's reward becomes its prompt's pass@k (groups of ``n`` consecutive samples).

    A sample succeeds when its reward is ``>= threshold``.
    """
    if n <= 0 or len(rewards) % n:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of n={n}")
    out: list[float] = []
    for start in range(0, len(rewards), n):
        group = rewards[start : start + n]
        value = pass_at_k(n, sum(1 for r in group if r >= threshold), k)
        out.extend([value] * n)
    return out
