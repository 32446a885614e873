"""The runtime: what a training session runs (session, loop, evaluator, pools, backends,
model provisioning, held-out scoring, progress and trackers). It imports neither the CLI,
the Python API, search nor rebuild (tests/test_layout.py)."""
