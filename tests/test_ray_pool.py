"""The Ray pool reaches the local pool's fingerprints, with and without a killed worker.

A real local Ray cluster (2 CPUs, small object store) and the `tiny` model, driven
through `engine.session.start`, so the pool is exercised exactly as `seedledger train`
uses it.
"""

from __future__ import annotations

import logging
import os
import signal

import pytest

from engine.pools.ray import actor_resources, assign, check_agreement
from ledger.errors import SeedLedgerError

TINY = [
    "model=tiny",
    "task=arithmetic",
    "population=4",
    "batch_size=2",
    "max_new_tokens=4",
    "seed=7",
    # A random tiny model never answers right; a length penalty and a large σ give the
    # members different rewards, so every generation moves the weights.
    "task.rewards=[task, {fn: length, limit: 12}]",
    "sigma=0.05",
    "lr=0.01",
]
GENERATIONS = 3
RAY = ["workers.pool=ray", "workers.count=2"]


# -- pure helpers (no Ray) -------------------------------------------------------------


def test_members_are_assigned_round_robin_in_member_order():
    assert assign(5, 2) == [[0, 2, 4], [1, 3]]
    assert assign(2, 3) == [[0], [1], []]


def test_disagreeing_workers_abort_naming_worker_and_generation():
    assert check_agreement(["ab" * 16] * 3, 4) == "ab" * 16
    with pytest.raises(SeedLedgerError, match="worker 2 .* generation 4"):
        check_agreement(["ab" * 16, "ab" * 16, "cd" * 16], 4)


def test_cpu_workers_split_the_cluster_and_gpu_workers_take_one_gpu():
    from engine.config import validate

    cpu = validate({"workers": {"pool": "ray", "count": 2}})
    assert actor_resources(cpu, 2.0) == ({"num_cpus": 1.0}, 1)
    assert actor_resources(cpu, 1.0) == ({"num_cpus": 0.5}, 1)
    assert actor_resources(cpu, 5.0) == ({"num_cpus": 2.0}, 2)
    gpu = validate({"device": "cuda", "workers": {"pool": "ray", "count": 2}})
    assert actor_resources(gpu, 16.0) == ({"num_gpus": 1, "num_cpus": 1}, 1)


# -- a real cluster (the first test lets the pool start one; the next uses a fixture's) --


def _train(tmp_path, overrides, hooks=None):
    from engine import session
    from ledger import Ledger

    with Ledger.open(tmp_path / "ledger.db") as ledger:
        result = session.start(ledger, None, "r", TINY + overrides, GENERATIONS, hooks)
    return [r.fingerprint for r in result.records], [
        [m.reward for m in r.members] for r in result.records
    ], result.fingerprint


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("local"), [])


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    owned = not ray.is_initialized()
    if owned:
        ray.init(
            address="local",
            num_cpus=2,
            object_store_memory=200 * 2**20,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    yield ray
    if owned:
        ray.shutdown()


@pytest.mark.ray
def test_two_workers_reach_the_local_pools_fingerprints(local_run, tmp_path, monkeypatch):
    """The pool starts its own local cluster here (none is running yet) and stops it."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("Ray already initialised in this process")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("SEEDLEDGER_RAY_OBJECT_STORE", str(200 * 2**20))
    fingerprints, rewards, final = _train(tmp_path, RAY)
    assert not ray.is_initialized()  # close() shut down the cluster it started
    assert len(fingerprints) == GENERATIONS
    assert (fingerprints, rewards, final) == local_run
    assert len(set(fingerprints)) == GENERATIONS  # the model moved every generation


@pytest.mark.ray
def test_a_worker_killed_mid_generation_is_rebuilt_and_changes_nothing(
    cluster, local_run, tmp_path, monkeypatch
):
    from engine import session
    from engine.loop import Hooks

    pools = []

    def capture(cfg, model_dir):
        pools.append(session_make_pool(cfg, model_dir))
        return pools[-1]

    session_make_pool = session.make_pool
    monkeypatch.setattr(session, "make_pool", capture)
    state: dict = {"generation": 0, "pids": None, "killed": None}

    def on_generation_start(generation: int, members: int) -> None:
        state["generation"] = generation
        if generation == 2:
            state["pids"] = pools[0].pids()  # asked while the workers are idle

    def on_member(result) -> None:
        # The first result of generation 2 has arrived: worker 1 still has member 3
        # queued (members 1 and 3 are its share), so it dies with work in flight.
        if state["generation"] == 2 and state["killed"] is None:
            state["killed"] = state["pids"][1]
            os.kill(state["killed"], signal.SIGKILL)

    hooks = Hooks(on_generation_start=on_generation_start, on_member=on_member)
    fingerprints, rewards, final = _train(tmp_path, RAY, hooks)
    assert state["killed"] is not None
    # Replaced while the pool stood at generation 1, i.e. during generation 2's evaluate.
    assert [r["worker"] for r in pools[0].replacements] == [1]
    assert pools[0].replacements[0]["generation"] == 1
    assert (fingerprints, rewards, final) == local_run
