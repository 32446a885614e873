"""What to change when a generation has no signal (every member tied), for this run.

Why: a new user's SmolLM2 runs tied in most generations, and "raise sigma" alone did not
say by how much or what else helps. The advice names values from the run's own settings:
σ for its perturbation kind (σ in force ×3, at least the kind's usual scale: 1e-3 for
full-rank and low-rank noise on the weights, 1e-2 for a LoRA adapter, whose B starts at
zero), more rows per generation, sampling instead of greedy decoding, and the dense
`loglik` reward, which differs between members however small σ is.
"""

from __future__ import annotations

from seedledger.engine.config import MAX_BATCH, TrainConfig
from seedledger.trainers.tasks.registry import uses_loglik

SAMPLING_TEMPERATURE = 0.7


def suggested_sigma(usual: float, sigma: float) -> float:
    """σ ×3, at least the kind's usual scale (`PerturbationKind.usual_sigma`), on one significant digit."""
    return float(f"{max(3 * sigma, usual):.0e}")


def advice(cfg: TrainConfig, sigma: float) -> str:
    """One clause of concrete changes for `cfg`, whose generation ran at `sigma`."""
    kind = cfg.perturbation_type()
    tips = [f"sigma: {suggested_sigma(kind.usual_sigma, sigma):g} (now {sigma:.3g}, {kind.label} noise)"]
    if cfg.batch_size < MAX_BATCH:
        tips.append(f"batch_size: {min(2 * cfg.batch_size, MAX_BATCH)} (now {cfg.batch_size}: "
                    "more rows per generation, fewer ties)")
    if cfg.sampling.temperature <= 0:
        tips.append(f"sampling: {{temperature: {SAMPLING_TEMPERATURE}}} (now greedy)")
    some, _ = uses_loglik(cfg.task)
    if not some and cfg.passk is None:
        tips.append("the dense reward `loglik` in the task's rewards (e.g. rewards: [task, loglik]; "
                    "it needs an answer column)")
    return "try " + "; ".join(tips)
