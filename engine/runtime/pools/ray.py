"""The Ray pool: one replica actor per worker, synchronised by seeds alone.

Every actor loads the base model once and keeps its own fp32 master; after each
generation it applies the same record through replay's update, so the replicas stay
identical without exchanging weights. Worker w scores a fixed contiguous chunk of whole
forward groups (`assign`: static, so which worker scored a member never depends on
timing, and the rows sharing a forward are the local pool's), and results come back in
member order, so the record is the local pool's. Each worker reports its fingerprint after
every `apply`; a disagreement aborts the run naming the worker and generation.

Fault tolerance: a worker that dies (its process, or its whole node) is replaced by a
fresh actor with the same resources, and its chunk is scored again at once by a worker
that is left (replicas are identical and scoring is deterministic, so the generation's
result is what it would have been without the fault; a chunk keeps its members, so the
rows sharing a forward do not change). The replacement is started without waiting: Ray
places it where there is room (a node left, or a node that joins later), and at the start
of the next generation after it is placed it rebuilds its master from the ledger up to the
last committed generation (plus the one applied but not yet committed, which the pool
keeps) and takes its chunk back. Until then the workers left score its chunk: a run on a
cluster that lost a node goes on, slower. With no worker left the pool waits for a
replacement to be placed, up to PLACEMENT_SECONDS.

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
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seedledger.engine.config import TrainConfig
from seedledger.engine.runtime.pools import PoolFailure, ReplicaMismatch
from seedledger.engine.runtime.pools.ray_setup import (
    RayActorError,
    actor_resources,
    assign,
    check_agreement,
    connect,
    get,
    hook_generation,
    ray,
)
from seedledger.engine.runtime.pools.ray_worker import ReplicaActor
from seedledger.engine.runtime.scoring.evaluator import Batch, generation_batch
from seedledger.ledger import Ledger, ReplayStep
from seedledger.ledger.db import to_url
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.member import Member
from seedledger.trainers.tasks import load_task

__all__ = ["RayPool", "actor_resources", "assign", "check_agreement", "connect"]

# Deaths of one worker within one generation before the pool gives up (a crash loop).
MAX_RESTARTS = 3
# How often the driver renews the writer lease while it waits for the workers' chunks.
HEARTBEAT_SECONDS = 10.0
# How long the pool waits for Ray to place a replacement when no worker is left.
PLACEMENT_SECONDS = 600.0


class RayPool:
    """The `LocalPool` surface over W Ray actors (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, model_dir: Path):
        self.cfg = cfg
        self.model_dir = str(model_dir)
        self.task = load_task(cfg.task, seed=cfg.seed)
        self.replacements: list[dict[str, Any]] = []  # one per dead worker replaced
        # where the last chunks were scored: {"generation", "worker", "node", "members"}
        self.chunks: deque[dict[str, Any]] = deque(maxlen=8 * cfg.workers.count)
        self.generation = 0
        self._owns_connection = connect(cfg.workers.address)
        self._actors: list[Any] = []
        self._nodes: list[str | None] = []  # Ray node id per worker; None: being replaced
        self._placing: dict[int, Any] = {}  # worker -> its replacement's node() call
        self._losses = [0] * cfg.workers.count  # deaths per worker in this generation
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
            # `_lose` starts a fresh one that `_admit` brings to the pool's generation.
            self._remote = ray.remote(max_restarts=0, max_task_retries=0, **options)(ReplicaActor)
            self._actors = [self._spawn(w, first=True) for w in range(cfg.workers.count)]
            fps = get([a.base_fingerprint.remote() for a in self._actors])
            self._base = check_agreement(fps, 0)
            self._nodes = get([a.node.remote() for a in self._actors])
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

    def _live(self) -> list[int]:
        return [w for w, node in enumerate(self._nodes) if node is not None]

    def pids(self) -> list[int | None]:
        """Worker process ids, in worker order (None for a worker being replaced)."""
        return [get(a.pid.remote()) if n else None for a, n in zip(self._actors, self._nodes, strict=True)]

    def nodes(self) -> list[str | None]:
        """The Ray node id of each worker, in worker order (None for one being replaced)."""
        return list(self._nodes)

    def gpus(self) -> list[list[str]]:
        """The GPU ids Ray assigned each worker in service, in worker order."""
        return [get(self._actors[w].gpus.remote()) for w in self._live()]

    def wait_for_replacements(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for Ray to place every pending replacement (they
        join at the next generation's start); True when all are placed. One placed on a
        node that died before Ray noticed dies too, and is replaced again."""
        deadline = time.monotonic() + timeout
        while self._placing:
            refs = {ref: worker for worker, ref in self._placing.items()}
            left = deadline - time.monotonic()
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=max(0.0, left))
            died = False
            for ref in ready:
                try:
                    get(ref)
                except RayActorError as exc:
                    self._lose(refs[ref], exc)
                    died = True
            if not died:
                return len(ready) == len(refs)
        return True

    def _lose(self, worker: int, why: BaseException) -> None:
        """Worker `worker`'s actor died: record it and start a replacement (not waited for)."""
        self._losses[worker] += 1
        if self._losses[worker] > MAX_RESTARTS:
            raise PoolFailure(
                f"worker {worker} died {self._losses[worker]} times at generation {self.generation}: "
                f"{' '.join(str(why).split())[:300]}"
            ) from why
        self.replacements.append(
            {"worker": worker, "generation": self.generation, "error": type(why).__name__}
        )
        try:
            ray.kill(self._actors[worker], no_restart=True)
        except Exception:  # already gone
            pass
        self._actors[worker] = self._spawn(worker)
        self._nodes[worker] = None
        self._placing[worker] = self._actors[worker].node.remote()
        logging.getLogger(__name__).warning(
            "worker %d died (%s) at generation %d; the workers left score its members until "
            "its replacement is placed and rebuilt", worker, type(why).__name__, self.generation,
        )
        if self._ledger is not None and self._run is not None:
            try:  # the audit trail; the driver is the ledger's writer
                self._ledger.log_event(self._run, "worker_restart", self.replacements[-1])
            except SeedLedgerError:
                pass

    def _catch_up(self, worker: int) -> str:
        """A placed replacement rebuilt at the pool's generation; its fingerprint."""
        actor, target = self._actors[worker], self.generation
        if self._run is None:  # never restored: the base model is the state
            return get(actor.base_fingerprint.remote())
        committed = min(target, self._ledger.latest_generation(self._run))
        committed = max(committed, self._restored_at)
        fp = get(actor.restore.remote(self._url, self._run, committed, self._anchors))
        if target > committed:
            step = self._last_step
            if step is None or step.index != target or target != committed + 1:
                raise PoolFailure(
                    f"worker {worker} is rebuilt at generation {target}, and generations "
                    f"{committed + 1}..{target} are neither committed nor held by the pool"
                )
            fp = get(actor.apply.remote(step))
        return fp

    def _admit(self, expected: str | None, wait: bool = False, heartbeat: Callable[[], None] | None = None):
        """Replacements that Ray has placed, rebuilt to the pool's generation and back in
        service: their (worker, fingerprint). `expected`: the fingerprint they must reach.
        With `wait` (no worker left), blocks until one is admitted."""
        admitted: list[tuple[int, str]] = []
        deadline = time.monotonic() + PLACEMENT_SECONDS
        while True:
            for worker, ref in list(self._placing.items()):
                if not ray.wait([ref], timeout=0)[0]:
                    continue
                del self._placing[worker]
                try:
                    node = get(ref)
                    fp = self._catch_up(worker)
                except RayActorError as exc:
                    self._lose(worker, exc)
                    continue
                if expected is not None and fp != expected:
                    raise ReplicaMismatch(
                        f"worker {worker} rebuilt generation {self.generation} with fingerprint "
                        f"{fp[:16]}…, expected {expected[:16]}…; aborting the run"
                    )
                self._nodes[worker] = node
                admitted.append((worker, fp))
            if admitted or not wait:
                return admitted
            if time.monotonic() > deadline:
                raise PoolFailure(
                    f"no worker is left at generation {self.generation} and Ray placed no "
                    f"replacement within {PLACEMENT_SECONDS:.0f} s: no node has room for one"
                )
            ray.wait(list(self._placing.values()), num_returns=1, timeout=HEARTBEAT_SECONDS)
            if heartbeat is not None:
                heartbeat()

    def _everyone(self, call: Callable[[Any], Any], generation: int) -> str:
        """One call on every worker in service; their common fingerprint. A worker that
        dies is replaced; with none left, the first replacement placed answers."""
        live = self._live()
        refs = [call(self._actors[w]) for w in live]
        answers = []
        for worker, ref in zip(live, refs, strict=True):
            try:
                answers.append((worker, get(ref)))
            except RayActorError as exc:
                self._lose(worker, exc)
        if not answers:
            answers = self._admit(None, wait=True)
        return check_agreement([fp for _, fp in answers], generation, [w for w, _ in answers])

    def _one(self, call: Callable[[Any], Any]) -> Any:
        """One call on the first worker in service (another if it dies)."""
        while True:
            live = self._live() or [w for w, _ in self._admit(self._fingerprint, wait=True)]
            try:
                return get(call(self._actors[live[0]]))
            except RayActorError as exc:
                self._lose(live[0], exc)

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
        self._fingerprint = self._everyone(
            lambda a: a.restore.remote(self._url, run, generation, self._anchors), generation
        )
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
        called while waiting, so a long chunk does not let the writer lease lapse). A dead
        worker's chunk goes to a worker left; placed replacements join first."""
        self._losses = [0] * len(self._actors)
        self._admit(self._fingerprint, wait=not self._live(), heartbeat=heartbeat)
        scored: list[Member | None] = [None] * len(members)
        plan = assign(len(members), len(self._actors), self.cfg.members_per_forward or 1)
        pending: dict[Any, tuple[int, int, Any]] = {}  # ref -> (chunk, worker, its actor)

        def submit(chunk: int) -> None:
            if not plan[chunk]:
                return
            live = self._live() or [w for w, _ in self._admit(self._fingerprint, True, heartbeat)]
            worker = chunk if chunk in live else live[chunk % len(live)]
            actor = self._actors[worker]
            part = members[plan[chunk].start : plan[chunk].stop]
            pending[actor.score_population.remote(part, sigma, generation, run_key, batch)] = (chunk, worker, actor)

        for chunk in range(len(self._actors)):
            submit(chunk)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=HEARTBEAT_SECONDS)
            if not ready:
                if heartbeat is not None:
                    heartbeat()
                continue
            chunk, worker, actor = pending.pop(ready[0])
            try:
                outs = get(ready[0])
            except RayActorError as exc:
                if self._actors[worker] is actor:  # the first news of this death
                    self._lose(worker, exc)
                submit(chunk)  # the whole chunk again: scoring is deterministic
                continue
            self.chunks.append(
                {"generation": generation, "worker": worker, "node": self._nodes[worker], "members": len(outs)}
            )
            for pos, member in zip(plan[chunk], outs, strict=True):
                scored[pos] = member
                if on_member:
                    on_member(member)
        return scored  # type: ignore[return-value]

    def apply(self, step: ReplayStep) -> str:
        """Every worker applies the record; they must agree on the fingerprint."""
        self._last_step, self.generation = step, step.index
        self._fingerprint = self._everyone(lambda a: a.apply.remote(step), step.index)
        return self._fingerprint

    def held_out_reward(self, limit: int) -> float:
        return self._one(lambda a: a.held_out_reward.remote(limit))

    def state(self):
        """(master, optimizer state) from one worker: the one call that moves weights, for
        anchors and algorithms that read the master (a session's final fingerprint is
        `fingerprint()`)."""
        return self._one(lambda a: a.state.remote())

    def close(self) -> None:
        """Stop the actors, and the Ray connection (with its local cluster) if ours."""
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        self._actors, self._placing = [], {}
        if self._owns_connection and ray.is_initialized():
            ray.shutdown()
        self._owns_connection = False
