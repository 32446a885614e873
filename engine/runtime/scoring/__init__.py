"""Rewards measured: the replica that scores a generation's members and applies its update
(`evaluator`), held-out rows of RUN@G for `evaluate`, `tune`, `pbt` and `evaluation.every`
(`heldout`), and what to change when a generation has no signal (`no_signal`).
"""
