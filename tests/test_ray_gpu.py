"""`workers.gpus_per_worker`: Ray gives every replica its share of the node's GPUs (1: one
replica per GPU; 0.5: two share one), and the run equals the local pool on CUDA bit for
bit. Needs CUDA: skipped without it (and on machines with neither Ray nor a GPU)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu, pytest.mark.ray,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

TINY = ["model=tiny", "task=arithmetic", "population=4", "batch_size=2", "max_new_tokens=4", "seed=7",
        "task.rewards=[task, {fn: length, limit: 12}]", "sigma=0.0625", "lr=0.01", "device=cuda"]


def _train(tmp_path, overrides):
    from seedledger.engine.runtime import session
    from seedledger.ledger import Ledger

    with Ledger.open(tmp_path / "ledger.db") as ledger:
        result = session.start(ledger, None, "r", TINY + overrides, 2, None)
    return [r.fingerprint for r in result.records]


def test_each_worker_gets_its_gpus_and_the_run_equals_the_local_pool(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from seedledger.engine.runtime import session

    gpus = torch.cuda.device_count()
    # one replica per GPU where there are two or more; two replicas sharing one otherwise
    count, share = (gpus, 1.0) if gpus > 1 else (2, 0.5)
    (tmp_path / "local").mkdir()
    (tmp_path / "ray").mkdir()
    local = _train(tmp_path / "local", [])
    assigned = []  # the GPU ids of each worker, asked while the pool is up
    make_pool = session.make_pool

    def recording(cfg, model_dir):
        pool = make_pool(cfg, model_dir)
        assigned.append(pool.gpus())
        return pool

    monkeypatch.setattr(session, "make_pool", recording)
    ray.init(address="local", num_cpus=max(2, count), num_gpus=gpus, include_dashboard=False,
             logging_level=logging.WARNING)
    try:
        assert _train(tmp_path / "ray", ["workers.pool=ray", f"workers.count={count}",
                                         f"workers.gpus_per_worker={share}"]) == local
    finally:
        ray.shutdown()
    (ids,) = assigned
    assert all(len(g) == 1 for g in ids), ids
    if share == 1.0:
        assert len({g[0] for g in ids}) == count, f"two replicas on one GPU: {ids}"
    else:
        assert ids[0] == ids[1], ids
