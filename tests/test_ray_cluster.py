"""Several Ray nodes: a run across nodes equals the local pool bit for bit, a whole node
lost mid-generation changes nothing, a node that joins takes work, and a driver killed
mid-generation is resumed from another process to the same bits.

The cluster is Ray's own `ray.cluster_utils.Cluster`: a head (GCS, no CPUs: it only
hosts the driver) and two worker nodes, each a real raylet with its own object store,
temp dir, one CPU and a resource naming it. Killing a node kills its raylet and every
worker on it, as a lost machine would. The ledger is PostgreSQL (the suite's throw-away
server), which every node's workers open themselves; the driver is the CLI (in process,
or the console script where the process boundary is tested) joining through
RAY_ADDRESS, except in the node-loss tests, which drive `session.start` to kill nodes
from a hook at a known point.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
from test_cli_walkthrough import Cli

from seedledger.ledger import Ledger
from tests.support.cli import ROOT, script

pytestmark = [pytest.mark.ray, pytest.mark.multinode, pytest.mark.postgres]

TINY = ["model=tiny", "task=arithmetic", "population=4", "batch_size=2", "max_new_tokens=4", "seed=7",
        "task.rewards=[task, {fn: length, limit: 12}]", "sigma=0.0625", "lr=0.01"]
RAY = ["workers.pool=ray", "workers.count=2"]
NODE = {"object_store_memory": 80 * 2**20, "include_dashboard": False}
# node death noticed in ~2 s (Ray's default health check waits ~15 s)
FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}


@pytest.fixture(scope="module")
def cluster():
    """(Cluster, its temp root): a head without CPUs and nodes `node_a`, `node_b`."""
    pytest.importorskip("ray")
    from ray._common.utils import get_default_ray_temp_dir
    from ray.cluster_utils import Cluster

    root = tempfile.mkdtemp(prefix="slr-", dir="/tmp")  # short: raylet socket paths have a limit
    # Ray writes the head's address to its default temp dir whatever temp_dir says, and fails
    # where that dir does not exist yet (a fresh machine whose first Ray start is this one)
    os.makedirs(get_default_ray_temp_dir(), exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "temp_dir": f"{root}/head", "_system_config": FAST_HEALTH, **NODE})
    for name in ("node_a", "node_b"):
        cluster.add_node(num_cpus=1, resources={name: 1}, temp_dir=f"{root}/{name}", **NODE)
    cluster.wait_for_nodes()
    yield cluster, root
    cluster.shutdown()
    shutil.rmtree(root, ignore_errors=True)  # the nodes' session logs and sockets


def _env(cluster, pg_url: str) -> dict[str, str]:
    return {"RAY_ADDRESS": cluster[0].address, "RAY_USAGE_STATS_ENABLED": "0", "SEEDLEDGER_DB": pg_url,
            "PYTHONPATH": str(ROOT)}


def _train_args(overrides: list[str], generations: int) -> list[str]:
    return ["train", "--run", "r", "--json"] + [
        x for kv in TINY + overrides + [f"generations={generations}"] for x in ("--set", kv)]


def _history(location: str, run: str = "r") -> tuple[list[str], list[list[float]]]:
    with Ledger.open(location, create=False) as led:
        records = led.records(run)
    return [r.fingerprint for r in records], [[m.reward for m in r.members] for r in records]


def _local(tmp_path, overrides: list[str], generations: int):
    (tmp_path / "local").mkdir()
    Cli(tmp_path / "local").json(*_train_args(overrides, generations))
    return _history(str(tmp_path / "local" / "ledger.db"))


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    """The local pool's 3 generations of the plain config: what the fault tests must reach."""
    return _local(tmp_path_factory.mktemp("undisturbed"), [], 3)


# Across nodes, one run per path the fault tests (full rank, ES) leave: a GA over low-rank
# members in chunks of 2. Each kind's equality on Ray workers is tests/test_ray_pool.py's
# (low-rank, LoRA, loglik on one node); what crosses a node (the master, the chunks, the
# results) is the same for every kind, and the fault tests cross nodes to the local bits.
ACROSS_NODES = ["algorithm=ga", "mirrored=false", "optimizer=sgd", "sigma=0.05", "lr=1.0",
                "perturbation={kind: lowrank, rank: 1}", "population=6", "members_per_forward=2"]


def test_a_run_across_nodes_equals_the_local_pool_and_a_killed_driver_is_resumed_from_another_process(
    cluster, pg_url, tmp_path
):
    """Two workers on two nodes (one CPU each, so one worker per node), PostgreSQL ledger,
    driven by the console script, which is SIGKILLed after its first scored member of
    generation 2 (its actors die with it) and keeps generation 1; `resume` in another
    process joins the same cluster: the fingerprints and rewards of every generation are
    the local pool's, and no worker was restarted."""
    local = _local(tmp_path, ACROSS_NODES, 3)
    env = {**os.environ, **_env(cluster, pg_url), "SEEDLEDGER_FAILPOINT": "member@2"}
    started = time.monotonic()
    proc = subprocess.run([*script(), *_train_args(ACROSS_NODES + RAY, 3)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert _history(pg_url)[0] == local[0][:1], f"killed after {time.monotonic() - started:.0f} s"
    cli = Cli(tmp_path)
    cli.env.update(_env(cluster, pg_url))
    out = json.loads(cli.run("resume", "r", "--json", "--trust-code").stdout)
    assert out["latest_generation"] == 3 and out["fingerprint"] == local[0][-1]
    assert _history(pg_url) == local
    assert len(set(local[0])) == 3  # the model moved every generation
    with Ledger.open(pg_url, create=False) as led:
        assert not led.events("r", kind="worker_restart")


@pytest.mark.parametrize("algorithm", [
    ["algorithm=lmmaes", "train={kind: lora, rank: 4}", "mirrored=false", "optimizer=sgd"],
    ["algorithm=ga", "ga.survivors=2", "mirrored=false", "optimizer=sgd"],
], ids=["lmmaes", "ga-survivors"])
def test_algorithms_with_member_terms_are_refused_on_ray_in_one_line(algorithm, tmp_path):
    """LM-MA-ES and a GA with several survivors build members along replay-state vectors
    that only the driver's process holds: refused before anything starts."""
    line = Cli(tmp_path).bad(*_train_args(algorithm + RAY, 2))
    assert "workers.pool=ray" in line and "workers.pool: local" in line, line
    assert not (tmp_path / "ledger.db").exists() or not _history(str(tmp_path / "ledger.db"))[0]


def test_a_node_lost_mid_generation_changes_nothing_and_a_joining_node_takes_work(
    cluster, undisturbed, pg_url, monkeypatch
):
    """Worker 1 (alone on its node) blocks in generation 2 (the stall hook); when worker 0's
    first result of generation 2 arrives, worker 1's whole node is killed and a third node
    joins. Generation 2 completes on the node left, nothing committed is lost, the
    replacement lands on the new node and scores its chunk from generation 3 on, and every
    fingerprint is the undisturbed run's."""
    from seedledger.engine.runtime import session
    from seedledger.engine.runtime.hooks import Hooks

    nodes, root = cluster
    reference = undisturbed
    pools, state = [], {"generation": 0, "killed": None, "joined": None, "committed": None}
    make_pool = session.make_pool
    monkeypatch.setattr(session, "make_pool", lambda cfg, d: pools.append(make_pool(cfg, d)) or pools[-1])
    for key, value in _env(cluster, pg_url).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SEEDLEDGER_RAY_STALL", "1@2")

    def on_generation_start(generation: int, members: int) -> None:
        state["generation"] = generation
        if generation == 3:  # the replacement has been started; let Ray place it first
            assert pools[0].wait_for_replacements(timeout=180)

    def on_member(result) -> None:
        if state["generation"] != 2 or state["killed"] is not None:
            return
        pool = pools[0]
        victim = pool.nodes()[1]
        (node,) = [n for n in nodes.worker_nodes if n.node_id == victim]
        with Ledger.open(pg_url, create=False) as led:
            state["committed"] = _history(pg_url)[0]
            assert led.latest_generation("r") == 1
        nodes.remove_node(node, allow_graceful=False)  # its raylet, object store, workers
        state["killed"] = victim
        state["joined"] = nodes.add_node(
            num_cpus=1, resources={"node_c": 1}, temp_dir=f"{root}/node_c", **NODE).node_id

    hooks = Hooks(on_generation_start=on_generation_start, on_member=on_member)
    with Ledger.open(pg_url) as led:
        session.start(led, None, "r", TINY + RAY, 3, hooks)
    pool = pools[0]
    assert state["killed"] is not None and state["committed"] == reference[0][:1]
    # worker 1 died in generation 2's evaluate (the pool stood at 1); a replacement that
    # Ray placed on the dead node before noticing its death dies too and is replaced again
    assert (pool.replacements[0]["worker"], pool.replacements[0]["generation"]) == (1, 1)
    assert {r["worker"] for r in pool.replacements} == {1}
    gen2 = [c for c in pool.chunks if c["generation"] == 2]
    assert {c["node"] for c in gen2} == {pool.nodes()[0]}, "generation 2 finished on the node left"
    gen3 = {c["worker"]: c["node"] for c in pool.chunks if c["generation"] == 3}
    assert gen3[1] == state["joined"], "the joining node scored worker 1's chunk in generation 3"
    assert _history(pg_url) == reference
    with Ledger.open(pg_url, create=False) as led:
        events = led.events("r", kind="worker_restart")
        assert [e.payload for e in events] == pool.replacements


def test_with_every_worker_node_lost_the_generation_waits_for_a_node_and_completes(
    cluster, undisturbed, pg_url, monkeypatch
):
    """Every worker node is killed in generation 2 (worker 1 stalled, worker 0 done with
    its chunk) and one two-CPU node joins: the pool has no worker left, waits for Ray to
    place the replacements there, rebuilds them from the ledger and finishes the run with
    the undisturbed fingerprints."""
    from seedledger.engine.runtime import session
    from seedledger.engine.runtime.hooks import Hooks

    nodes, root = cluster
    pools, state = [], {"generation": 0, "joined": None}
    make_pool = session.make_pool
    monkeypatch.setattr(session, "make_pool", lambda cfg, d: pools.append(make_pool(cfg, d)) or pools[-1])
    for key, value in _env(cluster, pg_url).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SEEDLEDGER_RAY_STALL", "1@2")

    def on_generation_start(generation: int, members: int) -> None:
        state["generation"] = generation

    def on_member(result) -> None:
        if state["generation"] == 2 and state["joined"] is None:
            for node in list(nodes.worker_nodes):
                nodes.remove_node(node, allow_graceful=False)
            state["joined"] = nodes.add_node(
                num_cpus=2, resources={"node_d": 1}, temp_dir=f"{root}/node_d", **NODE).node_id

    with Ledger.open(pg_url) as led:
        session.start(led, None, "r", TINY + RAY, 3, Hooks(on_generation_start=on_generation_start,
                                                          on_member=on_member))
    pool = pools[0]
    assert {r["worker"] for r in pool.replacements} == {0, 1}
    gen3 = [c["node"] for c in pool.chunks if c["generation"] == 3]
    assert gen3 and set(gen3) == {state["joined"]}
    assert _history(pg_url) == undisturbed
