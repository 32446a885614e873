"""Reward functions (TRL-GRPO convention), their weighted combination, and reward shaping."""

from .answers import as_text, extract_tag, last_number, parse_number
from .combine import RewardFn, WeightedReward, combine, mean_components
from .curriculum import Curriculum, success_rate
from .format import format_reward, format_score
from .length import length_penalty
from .loader import load_reward_fn
from .passk import pass_at_k, pass_at_k_rewards
from .verifier import safe_eval

__all__ = [
    "Curriculum", "RewardFn", "WeightedReward", "as_text", "combine", "extract_tag",
    "format_reward", "format_score", "last_number", "length_penalty", "load_reward_fn",
    "mean_components", "parse_number", "pass_at_k", "pass_at_k_rewards", "safe_eval",
    "success_rate",
]
