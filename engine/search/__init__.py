"""Search over runs: `tune` (an Optuna study whose trials are forks) and PBT, built on the
runtime's sessions and held-out scoring."""
