"""The Ray pool reaches the local pool's fingerprints, with and without a killed worker;
joins an existing cluster; aborts (exit 1) when a replica diverges.

Real local Ray clusters (2 CPUs, small object store) and the `tiny` model, driven through
`engine.runtime.session.start` or the console script, so the pool is exercised exactly as
`seedledger train` uses it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from test_cli_walkthrough import Cli

from seedledger.engine.runtime.pools import PoolFailure, ReplicaMismatch
from seedledger.engine.runtime.pools.ray import actor_resources, assign, check_agreement
from tests.support.cli import script

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
    "sigma=0.0625",  # 2**-4: applied exactly, so no rounding note on stderr
    "lr=0.01",
]
GENERATIONS = 3
RAY = ["workers.pool=ray", "workers.count=2"]


# -- pure helpers (no Ray) -------------------------------------------------------------


def test_members_are_assigned_in_contiguous_whole_groups():
    assert assign(5, 2) == [range(0, 3), range(3, 5)]
    assert assign(2, 3) == [range(0, 1), range(1, 2), range(2, 2)]
    # groups of 2 members (members_per_forward): 4 groups over 3 workers, none split
    assert assign(8, 3, 2) == [range(0, 4), range(4, 6), range(6, 8)]
    assert assign(7, 2, 4) == [range(0, 4), range(4, 7)]


def test_disagreeing_workers_abort_naming_worker_and_generation():
    assert check_agreement(["ab" * 16] * 3, 4) == "ab" * 16
    with pytest.raises(ReplicaMismatch, match="worker 2 .* generation 4") as err:
        check_agreement(["ab" * 16, "ab" * 16, "cd" * 16], 4)
    assert err.value.exit_code == 1  # a failure of the run, not bad input
    assert issubclass(ReplicaMismatch, PoolFailure) and PoolFailure.exit_code == 1


def test_cpu_workers_split_the_cluster_and_gpu_workers_take_one_gpu():
    from seedledger.engine.config import validate

    cpu = validate({"workers": {"pool": "ray", "count": 2}})
    assert actor_resources(cpu, 2.0) == ({"num_cpus": 1.0}, 1)
    assert actor_resources(cpu, 1.0) == ({"num_cpus": 0.5}, 1)
    assert actor_resources(cpu, 5.0) == ({"num_cpus": 2.0}, 2)
    gpu = validate({"device": "cuda", "workers": {"pool": "ray", "count": 2}})
    assert actor_resources(gpu, 16.0) == ({"num_gpus": 1, "num_cpus": 1}, 1)


# -- a real cluster, started by the pool itself ---------------------------------------


def _train(tmp_path, overrides, hooks=None):
    from seedledger.engine.runtime import session
    from seedledger.ledger import Ledger

    with Ledger.open(tmp_path / "ledger.db") as ledger:
        result = session.start(ledger, None, "r", TINY + overrides, GENERATIONS, hooks)
    return [r.fingerprint for r in result.records], [
        [m.reward for m in r.members] for r in result.records
    ], result.fingerprint


# Low-rank members in groups of two, scored by decoded text and by likelihood (issue 30) at once.
LOWRANK = ["perturbation={kind: lowrank, rank: 1}", "population=6", "members_per_forward=2",
           "task.rewards=[task, {fn: length, limit: 12}, loglik]"]


@pytest.mark.ray
def test_two_workers_equal_the_local_pool_bit_for_bit_with_a_worker_killed_mid_generation(tmp_path, monkeypatch):
    """The pool starts its own local cluster here (none is running yet) and stops it. Six
    low-rank members in groups of two: worker 0 decodes groups 0-1, worker 1 group 2, so
    the rows sharing a forward are the local pool's; every worker also scores its members'
    reference answers (the likelihood reward) in its own batched forward. Worker 1 is killed
    at a known point: blocked in its chunk of generation 2 (the stall hook), so its members
    are in flight and the death is always noticed during generation 2's evaluate, never in
    apply. Its replacement (no stall) rebuilds generation 1 from the ledger and scores them
    again. Rewards and fingerprints are the local pool's, and no weights leave a worker."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("Ray already initialised in this process")
    from seedledger.engine.runtime import session
    from seedledger.engine.runtime.hooks import Hooks
    from seedledger.engine.runtime.pools.ray import RayPool

    (tmp_path / "local").mkdir()
    local = _train(tmp_path / "local", LOWRANK)

    def no_weights(self):
        raise AssertionError("weights pulled from a worker with no anchor to save")

    monkeypatch.setattr(RayPool, "state", no_weights)  # the session's end uses fingerprint()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("SEEDLEDGER_RAY_OBJECT_STORE", str(200 * 2**20))
    pools = []

    def capture(cfg, model_dir):
        pools.append(session_make_pool(cfg, model_dir))
        return pools[-1]

    session_make_pool = session.make_pool
    monkeypatch.setattr(session, "make_pool", capture)
    monkeypatch.setenv("SEEDLEDGER_RAY_STALL", "1@2")
    state: dict = {"generation": 0, "pids": None, "killed": None}

    def on_generation_start(generation: int, members: int) -> None:
        state["generation"] = generation
        if generation == 2:
            state["pids"] = pools[0].pids()  # asked while the workers are idle

    def on_member(result) -> None:
        # Worker 0's first result of generation 2: worker 1 is stalled in its chunk (members
        # 4 and 5) and cannot finish, so this kill always finds it there.
        if state["generation"] == 2 and state["killed"] is None:
            state["killed"] = state["pids"][1]
            os.kill(state["killed"], signal.SIGKILL)

    (tmp_path / "ray").mkdir()
    hooks = Hooks(on_generation_start=on_generation_start, on_member=on_member)
    fingerprints, rewards, final = _train(tmp_path / "ray", LOWRANK + RAY, hooks)
    assert not ray.is_initialized()  # close() shut down the cluster it started
    assert state["killed"] is not None
    # Replaced while the pool stood at generation 1, i.e. during generation 2's evaluate.
    assert pools[0].replacements == [
        {"worker": 1, "generation": 1, "error": pools[0].replacements[0]["error"]}
    ]
    assert len(fingerprints) == GENERATIONS
    assert (fingerprints, rewards, final) == local
    assert len(set(fingerprints)) == GENERATIONS  # the model moved every generation


# -- an existing cluster, joined through RAY_ADDRESS, via the console script ----------------

HEAD = """
import sys, ray
import ray._private.state as state
# address="local": a new cluster, never the one /tmp/ray/ray_current_cluster names (another
# test's, e.g. tests/test_ray_cluster.py's, which a plain ray.init() would try to join)
ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20,
         logging_level="WARNING")
print(ray.get_runtime_context().gcs_address, flush=True)
for line in sys.stdin:  # "jobs": the pids of every driver that joined so far
    print(" ".join(str(j["DriverPid"]) for j in state.jobs()), flush=True)
ray.shutdown()
"""


@pytest.fixture(scope="module")
def head():
    """A Ray head started by another process (as `ray start --head` would be): yields
    (address, ask, auth env) where ask() lists the pids of the drivers that joined it."""
    pytest.importorskip("ray")
    import secrets

    # Ray's token authentication with a token of this fixture's own (not ~/.ray/auth_token,
    # which other clusters on this machine may share or replace).
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, start_new_session=True,
        env={**os.environ, "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0", **auth},
    )
    try:
        address = proc.stdout.readline().strip()
        assert ":" in address, f"the head did not start (exit {proc.poll()})"

        def ask() -> set[int]:
            proc.stdin.write("jobs\n")
            proc.stdin.flush()
            return {int(p) for p in proc.stdout.readline().split()}

        yield address, ask, auth
    finally:
        proc.stdin.close()  # the head shuts its cluster down and exits
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this fixture started
            proc.wait()


def _cli_on(head, tmp_path, **env: str) -> Cli:
    address, _, auth = head
    cli = Cli(tmp_path)
    cli.env.update({"RAY_ADDRESS": address, "RAY_USAGE_STATS_ENABLED": "0", **auth, **env})
    return cli


TRAIN = ["train", "--run", "r", "--json"] + [
    x for kv in TINY + RAY + [f"generations={GENERATIONS}"] for x in ("--set", kv)
]


# An adapter run: each worker holds the frozen base and its own adapter master.
LORA = ["train={kind: lora, rank: 4, target_modules: [q_proj, v_proj, down_proj]}", "population=4",
        "members_per_forward=2", "max_new_tokens=6", "task.rewards=[task, {fn: length, limit: 30}]"]


@pytest.mark.ray
def test_the_console_script_joins_an_existing_cluster_and_a_lora_run_equals_the_local_pool(head, tmp_path):
    """The console script joins the head's cluster through RAY_ADDRESS; its LoRA run (each
    worker replays every record into its own adapter master) reaches the local pool's
    rewards and fingerprints bit for bit."""
    from seedledger.ledger import Ledger

    _, ask, _ = head
    (tmp_path / "local").mkdir()
    fingerprints, rewards, final = _train(tmp_path / "local", LORA)
    cli = _cli_on(head, tmp_path)
    train = ["train", "--run", "r", "--json"] + [
        x for kv in TINY + LORA + RAY + [f"generations={GENERATIONS}"] for x in ("--set", kv)]
    proc = subprocess.Popen(  # as Cli.run, but the driver's pid is needed
        [*script(), *train], cwd=tmp_path, env=cli.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert proc.pid in ask(), "the run did not join the head's cluster"
    assert json.loads(out)["fingerprint"] == final
    with Ledger.open(tmp_path / "ledger.db", create=False) as led:
        records = led.records("r")
    assert [r.fingerprint for r in records] == fingerprints
    assert [[m.reward for m in r.members] for r in records] == rewards
    assert len(set(fingerprints)) == GENERATIONS


@pytest.mark.ray
def test_a_diverging_replica_aborts_the_run_with_exit_1(head, tmp_path):
    from seedledger.ledger import Ledger

    cli = _cli_on(head, tmp_path, SEEDLEDGER_RAY_DIVERGE="1@2")
    err = cli.run(*TRAIN, code=1, process=True).stderr  # the console script's exit status
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "worker 1" in lines[0] and "generation 2" in lines[0] and "disagree" in lines[0]
    with Ledger.open(tmp_path / "ledger.db", create=False) as led:
        assert led.latest_generation("r") == 1, "the disputed generation never committed"
        assert led.get_run("r").status == "interrupted"
        (event,) = led.events("r", kind="error")
        assert event.payload["error"] == "ReplicaMismatch" and event.payload["generation"] == 2



# -- multi-machine preconditions: clear one-line errors ------------------------------------


def test_a_worker_without_the_model_or_the_ledger_says_so(tiny_model_dir, tmp_path):
    """What a worker on another node meets when the model path or a SQLite ledger exists
    only on the driver's machine (the actor class, called in process)."""
    from seedledger.engine.config import validate
    from seedledger.engine.runtime.pools.ray_worker import ReplicaActor
    from seedledger.ledger.errors import SeedLedgerError

    cfg = validate({"model": "tiny"}).model_dump(mode="json")
    missing = ReplicaActor(cfg, str(tmp_path / "no-model"), 1, worker=3)
    with pytest.raises(SeedLedgerError, match=r"worker 3 on host .*no-model.* every node"):
        missing.base_fingerprint()

    actor = ReplicaActor(cfg, str(tiny_model_dir), 1, worker=1)
    url = f"sqlite:///{tmp_path}/elsewhere/ledger.db"
    with pytest.raises(SeedLedgerError) as err:
        actor.restore(url, "r", 1, None)
    message = str(err.value)
    assert "worker 1 on host" in message and url in message and "PostgreSQL" in message
    assert "\n" not in message


@pytest.mark.ray
def test_a_workers_error_reaches_the_driver_as_one_line(tmp_path, monkeypatch):
    """One worker says it (the pool starts and stops its own cluster)."""
    from types import SimpleNamespace

    from seedledger.engine.config import validate
    from seedledger.engine.runtime.models.resolve import resolve_model
    from seedledger.engine.runtime.pools.ray import RayPool
    from seedledger.ledger.errors import SeedLedgerError

    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("SEEDLEDGER_RAY_OBJECT_STORE", str(200 * 2**20))
    cfg = validate({"model": "tiny", "workers": {"pool": "ray", "count": 1}})
    pool = RayPool(cfg, resolve_model("tiny"))
    try:
        nowhere = SimpleNamespace(location=str(tmp_path / "elsewhere" / "ledger.db"))
        with pytest.raises(SeedLedgerError) as err:
            pool.restore(nowhere, "r", 1, None)
    finally:
        pool.close()
    assert type(err.value) is SeedLedgerError  # not Ray's wrapper with a remote traceback
    assert "cannot open the ledger" in str(err.value) and "\n" not in str(err.value)
