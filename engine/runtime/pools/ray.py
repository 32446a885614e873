"""The Ray pool: one replica actor per worker, synchronised by seeds alone.

Every actor loads the base model once and keeps its own fp32 master; after each
generation it applies the same record through replay's update, so the replicas stay
identical without exchanging weights. Worker w scores a fixed contiguous chunk of whole
forward groups (`assign`: static, so which worker scored a member never depends on
timing, and the rows sharing a forward are the local pool's), and results come back in
member order, so the record is the local pool's. Each worker reports its fingerprint after
every `apply`; a disagreement aborts the run naming the worker and generation.

Fault tolerance: a worker that dies is replaced by a fresh actor that rebuilds its master
from the ledger up to the last committed generation (plus the one applied but not yet
committed, which the pool keeps), and its chunk is scored again. Scoring
is deterministic, so the generation's result is what it would have been without the
fault.

Workers import seedledger themselves: install it on every node (a local cluster also
finds it through the driver's working directory, which Ray puts on workers' path).

Several machines: every worker opens the ledger itself (read only, to rebuild its master
at start and after a fault), so `--ledger` must be a database URL every node reaches,
e.g. `postgresql+psycopg://host/seedledger`; a SQLite file is seen only by workers on its
own machine (a worker that cannot open the ledger fails the run with one line naming its
host). The model is passed by path: the same model directory (a local Hugging Face
directory, or `$SEEDLEDGER_HOME`'s provisioned cache) must exist at that path on every node.

Test hooks, read by the driver when it starts a worker: `SEEDLEDGER_RAY_DIVERGE=W@G` makes
worker W nudge one weight after applying generation G (the pool must abort, naming W and
G); `SEEDLEDGER_RAY_STALL=W@G` makes the first worker W block in its chunk of
generation G until killed (its replacement does not), so a kill lands at a known point.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from seedledger.engine.config import TrainConfig
from seedledger.engine.runtime.evaluator import Batch, generation_batch
from seedledger.engine.runtime.pools import PoolFailure, ReplicaMismatch
from seedledger.engine.runtime.pools.ray_worker import ReplicaActor
from seedledger.ledger import Ledger, ReplayStep
from seedledger.ledger.db import to_url
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.extras import require
from seedledger.trainers.member import Member
from seedledger.trainers.tasks import load_task

FEATURE = "workers.pool: ray"
ray = require("ray", FEATURE)  # this module is imported only when a config asks for Ray
RayActorError, RayTaskError = ray.exceptions.RayActorError, ray.exceptions.RayTaskError

# A local cluster only moves keys and numbers per call; `state()` is the one large
# object and Ray spills what does not fit. Override with SEEDLEDGER_RAY_OBJECT_STORE.
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
# Replacements per worker within one call before the pool gives up (a crash loop).
MAX_RESTARTS = 3
# How often the driver renews the writer lease while it waits for the workers' chunks.
HEARTBEAT_SECONDS = 10.0


def connect(address: str | None) -> bool:
    """Make sure this process is connected to Ray; True when this call did it.

    An already-initialised Ray (a caller's, a test's) is used as it is and left running.
    Otherwise an address from the config or $RAY_ADDRESS joins that cluster; with
    neither, a new local cluster (`address="local"`, so a `ray start` cluster on this
    machine is not joined by accident) is started with this machine's CPUs and no
    dashboard.
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
        return True
    store = int(os.environ.get("SEEDLEDGER_RAY_OBJECT_STORE", LOCAL_OBJECT_STORE_BYTES))
    ray.init(
        address="local",
        num_cpus=os.cpu_count() or 1,
        include_dashboard=False,
        object_store_memory=store,
        logging_level=logging.WARNING,
    )
    return True


def actor_resources(cfg: TrainConfig, cluster_cpus: float) -> tuple[dict[str, float], int]:
    """Ray resource options per actor and its torch thread count.

    One GPU per actor on CUDA; on CPU the cluster's CPUs are split evenly so that W
    workers fit on the machine (fractions below 1, whole numbers above).
    """
    workers = cfg.workers.count
    if cfg.device.startswith("cuda"):
        return {"num_gpus": 1, "num_cpus": 1}, 1
    share = cluster_cpus / workers
    cpus = share if share < 1 else float(int(share))
    return {"num_cpus": cpus}, max(1, int(share))


def assign(members: int, workers: int, group: int = 1) -> list[range]:
    """Member positions per worker: contiguous, whole groups of `group` members each (the
    run's `members_per_forward`), as even as whole groups allow, in member order. So the
    rows that share a forward are the same whatever the worker count."""
    groups = -(-members // group)
    share, extra = divmod(groups, workers)
    out, first = [], 0
    for w in range(workers):
        last = first + share + (w < extra)
        out.append(range(min(first * group, members), min(last * group, members)))
        first = last
    return out


def hook_generation(name: str, worker: int) -> int | None:
    """The generation that $SEEDLEDGER_RAY_<name>=W@G names for `worker`, if any."""
    spec = os.environ.get(f"SEEDLEDGER_RAY_{name}", "")
    w, _, g = spec.partition("@")
    if w.isdigit() and g.isdigit() and int(w) == worker:
        return int(g)
    return None


def get(ref: Any, **kwargs: Any) -> Any:
    """`ray.get`, except that a SeedLedgerError raised in a worker comes back as itself, one
    line, instead of wrapped in Ray's multi-line task error."""
    try:
        return ray.get(ref, **kwargs)
    except RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, SeedLedgerError):
            raise cause from None
        raise


def check_agreement(fingerprints: Sequence[str], generation: int) -> str:
    """The common fingerprint; ReplicaMismatch (exit 1) naming the first worker that differs."""
    first = fingerprints[0]
    for worker, fp in enumerate(fingerprints):
        if fp != first:
            raise ReplicaMismatch(
                f"worker {worker} has fingerprint {fp[:16]}… after generation {generation}, "
                f"worker 0 has {first[:16]}…: the replicas disagree; aborting the run"
            )
    return first


class RayPool:
    """The `LocalPool` surface over W Ray actors (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, model_dir: Path):
        self.cfg = cfg
        self.model_dir = str(model_dir)
        self.task = load_task(cfg.task, seed=cfg.seed)
        self.replacements: list[dict[str, Any]] = []  # one per dead worker replaced
        self.generation = 0
        self._owns_connection = connect(cfg.workers.address)
        self._actors: list[Any] = []
        self._ledger: Ledger | None = None
        self._url: str | None = None
        self._run: str | None = None
        self._anchors: str | None = None
        self._restored_at = 0
        self._last_step: ReplayStep | None = None
        self._fingerprint: str | None = None
        try:
            cpus = ray.cluster_resources().get("CPU", 1.0)
            options, self._threads = actor_resources(cfg, cpus)
            # No Ray-level restarts: a restarted actor would come back at the base model;
            # `_replace` brings a fresh one to the pool's generation instead.
            self._remote = ray.remote(max_restarts=0, max_task_retries=0, **options)(ReplicaActor)
            self._actors = [self._spawn(w, first=True) for w in range(cfg.workers.count)]
            fps = get([a.base_fingerprint.remote() for a in self._actors])
            self._base = check_agreement(fps, 0)
            self._fingerprint = self._base
        except BaseException:
            self.close()
            raise

    # -- actors ----------------------------------------------------------------------------

    def _spawn(self, worker: int, first: bool = False):
        return self._remote.remote(
            self.cfg.model_dump(mode="json"), self.model_dir, self._threads, worker,
            hook_generation("DIVERGE", worker), hook_generation("STALL", worker) if first else None,
        )

    def pids(self) -> list[int]:
        """Worker process ids, in worker order."""
        return ray.get([a.pid.remote() for a in self._actors])

    def _replace(self, worker: int, why: BaseException) -> str:
        """Swap a dead worker for a fresh actor at the pool's generation; its fingerprint."""
        self.replacements.append(
            {"worker": worker, "generation": self.generation, "error": type(why).__name__}
        )
        try:
            ray.kill(self._actors[worker], no_restart=True)
        except Exception:  # already gone
            pass
        actor = self._spawn(worker)
        self._actors[worker] = actor
        target = self.generation
        if self._run is None:  # never restored: the base model is the state
            fp = get(actor.base_fingerprint.remote())
        else:
            committed = min(target, self._ledger.latest_generation(self._run))
            committed = max(committed, self._restored_at)
            fp = get(actor.restore.remote(self._url, self._run, committed, self._anchors))
            if target > committed:
                step = self._last_step
                if step is None or step.index != target or target != committed + 1:
                    raise PoolFailure(
                        f"worker {worker} died at generation {target}, and generations "
                        f"{committed + 1}..{target} are neither committed nor held by the pool"
                    ) from why
                fp = get(actor.apply.remote(step))
        logging.getLogger(__name__).warning(
            "worker %d died (%s); replaced and rebuilt to generation %d",
            worker, type(why).__name__, target,
        )
        if self._ledger is not None and self._run is not None:
            try:  # the audit trail; the driver is the ledger's writer
                self._ledger.log_event(self._run, "worker_restart", self.replacements[-1])
            except SeedLedgerError:
                pass
        return fp

    def _collect(self, refs: list[Any]) -> list[str]:
        """Fingerprints from one call per worker; a dead worker is replaced, and the
        replacement's fingerprint (at the pool's generation) stands in for its answer."""
        out = []
        for worker, ref in enumerate(refs):
            try:
                out.append(get(ref))
            except RayActorError as exc:
                out.append(self._replace_checked(worker, exc, attempts=MAX_RESTARTS))
        return out

    def _replace_checked(self, worker: int, why: BaseException, attempts: int) -> str:
        for attempt in range(attempts):
            try:
                return self._replace(worker, why)
            except RayActorError as exc:
                why = exc
                if attempt == attempts - 1:
                    break
        raise PoolFailure(
            f"worker {worker} kept dying at generation {self.generation} "
            f"({attempts} replacements): {why}"
        ) from why

    # -- the LocalPool surface -------------------------------------------------------------

    def base_fingerprint(self) -> str:
        return self._base

    def fingerprint(self) -> str:
        """The fingerprint every worker reported after the last restore or apply."""
        return self._fingerprint

    def restore(self, ledger: Ledger, run: str, generation: int, anchors_dir: Path | None) -> str:
        self._ledger, self._run = ledger, run
        self._url = to_url(ledger.location)
        self._anchors = str(anchors_dir) if anchors_dir else None
        self._restored_at = self.generation = generation
        self._last_step = None
        refs = [a.restore.remote(self._url, run, generation, self._anchors) for a in self._actors]
        self._fingerprint = check_agreement(self._collect(refs), generation)
        return self._fingerprint

    def batch(self, generation: int, level: int | None = None) -> Batch:
        """The generation's batch, built once on the driver: its rows go to every worker
        (a few kilobytes of text), its indices to the record."""
        return generation_batch(self.task, self.cfg, generation, level)

    def evaluate(
        self,
        members: list[Member],
        sigma: float,
        generation: int,
        run_key: int,
        batch: Batch,
        on_member: Callable[[Member], None] | None = None,
        heartbeat: Callable[[], None] | None = None,
    ) -> list[Member]:
        """Every worker's contiguous chunk of members scored on `batch`; the scored members
        in member order (`on_member` hears a chunk's members as it arrives; `heartbeat` is
        called while waiting, so a long chunk does not let the writer lease lapse)."""
        scored: list[Member | None] = [None] * len(members)
        plan = assign(len(members), len(self._actors), self.cfg.members_per_forward or 1)
        pending: dict[Any, int] = {}  # ref -> worker

        def submit(worker: int) -> None:
            if plan[worker]:
                chunk = members[plan[worker].start : plan[worker].stop]
                ref = self._actors[worker].score_population.remote(chunk, sigma, generation, run_key, batch)
                pending[ref] = worker

        for worker in range(len(self._actors)):
            submit(worker)
        deaths = [0] * len(self._actors)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=HEARTBEAT_SECONDS)
            if not ready:
                if heartbeat is not None:
                    heartbeat()
                continue
            worker = pending.pop(ready[0])
            try:
                outs = get(ready[0])
            except RayActorError as exc:
                deaths[worker] += 1
                if deaths[worker] > MAX_RESTARTS:
                    raise PoolFailure(
                        f"worker {worker} died {deaths[worker]} times in generation {generation}"
                    ) from exc
                fp = self._replace_checked(worker, exc, attempts=MAX_RESTARTS)
                if fp != self._fingerprint:
                    raise ReplicaMismatch(
                        f"worker {worker} rebuilt generation {self.generation} with fingerprint "
                        f"{fp[:16]}…, expected {self._fingerprint[:16]}…; aborting the run"
                    ) from exc
                submit(worker)  # the whole chunk again: scoring is deterministic
                continue
            for pos, member in zip(plan[worker], outs, strict=True):
                scored[pos] = member
                if on_member:
                    on_member(member)
        return scored  # type: ignore[return-value]

    def apply(self, step: ReplayStep) -> str:
        """Every worker applies the record; they must agree on the fingerprint."""
        self._last_step, self.generation = step, step.index
        refs = [a.apply.remote(step) for a in self._actors]
        self._fingerprint = check_agreement(self._collect(refs), step.index)
        return self._fingerprint

    def held_out_reward(self, limit: int) -> float:
        try:
            return get(self._actors[0].held_out_reward.remote(limit))
        except RayActorError as exc:
            self._replace_checked(0, exc, attempts=MAX_RESTARTS)
            return get(self._actors[0].held_out_reward.remote(limit))

    def state(self):
        """(master, optimizer state) from worker 0: the one call that moves weights, for
        anchors only (a session's final fingerprint is `fingerprint()`)."""
        try:
            return get(self._actors[0].state.remote())
        except RayActorError as exc:
            self._replace_checked(0, exc, attempts=MAX_RESTARTS)
            return get(self._actors[0].state.remote())

    def close(self) -> None:
        """Stop the actors, and the Ray connection (with its local cluster) if ours."""
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        self._actors = []
        if self._owns_connection and ray.is_initialized():
            ray.shutdown()
        self._owns_connection = False
