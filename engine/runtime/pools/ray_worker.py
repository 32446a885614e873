"""The Ray actor behind `RayPool`: one model replica in its own process.

Arguments and results are small records of numbers and strings (members, the batch's
rows, σ, generation, replay steps, fingerprints), so the cost of a call does not grow with
the model: the weights stay in the actor, which replays every record itself. A member
crosses as the `Member` it is, and comes back scored.
Only `state()` returns tensors (anchors, not per generation).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from seedledger.engine.config import TrainConfig
from seedledger.engine.runtime.models.resolve import quiet_hf_env
from seedledger.engine.runtime.scoring.evaluator import Batch, Evaluator
from seedledger.ledger import Ledger, ReplayStep
from seedledger.ledger.db import display_location
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.member import Member


class ReplicaActor:
    """One `Evaluator` (base model loaded once, own fp32 master and optimizer state).

    Test hooks (see `RayPool`), both None outside tests: `diverge_at` makes this replica
    nudge one weight after applying that generation, as a replica on faulty hardware
    would, so the pool's agreement check can be exercised end to end; `stall_at` makes
    its first `score` of that generation block until the process is killed, so a test
    can kill it at a known point, with its members in flight.
    """

    def __init__(
        self, cfg: dict[str, Any], model_dir: str, threads: int, worker: int = 0,
        diverge_at: int | None = None, stall_at: int | None = None,
    ):
        # Workers of a cluster this process did not start do not inherit the CLI's
        # environment: keep library progress bars off (Ray forwards worker output to the
        # driver's stderr, where an error must stay one line) and the hub offline.
        quiet_hf_env()
        try:  # already imported with this module: switch them off through their APIs too
            from huggingface_hub.utils import disable_progress_bars
            from transformers.utils import logging as hf_logging

            disable_progress_bars()
            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()
        except ImportError:
            pass
        import torch

        self.worker = worker
        self.host = socket.gethostname()
        self.diverge_at = diverge_at
        self.stall_at = stall_at
        self.problem: str | None = None
        # Ray sets OMP_NUM_THREADS only for whole CPUs; size torch's pool explicitly so
        # that W actors on W cores do not oversubscribe them.
        torch.set_num_threads(max(1, threads))
        try:  # replay's CPU kernels are numba-parallel: same budget
            import numba

            numba.set_num_threads(min(max(1, threads), numba.config.NUMBA_NUM_THREADS))
        except ImportError:
            pass
        if not Path(model_dir).is_dir():
            # Raised by the first call (a task error the pool reports in one line), not
            # here: an actor that fails to construct only says that it died.
            self.problem = (
                f"worker {worker} on host {self.host}: the model directory {model_dir} does "
                "not exist there; with Ray on several machines every node needs the model "
                "at the same path"
            )
            return
        self.replica = Evaluator(TrainConfig.model_validate(cfg), Path(model_dir))

    def _ready(self) -> None:
        if self.problem is not None:
            raise SeedLedgerError(self.problem)

    def pid(self) -> int:
        """The process id (tests SIGKILL it to exercise recovery)."""
        return os.getpid()

    def node(self) -> str:
        """The Ray node this replica runs on (its answer also says it has been placed)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def gpus(self) -> list[str]:
        """The GPU ids Ray assigned this replica (its CUDA_VISIBLE_DEVICES)."""
        import ray

        return [str(g) for g in ray.get_gpu_ids()]

    def base_fingerprint(self) -> str:
        self._ready()
        return self.replica.base_fingerprint()

    def restore(self, url: str, run: str, generation: int, anchors_dir: str | None) -> str:
        """Rebuild `run@generation` from the ledger; this actor only reads it."""
        self._ready()
        try:
            ledger = Ledger.open(url, upgrade=False, create=False)
        except Exception as exc:  # noqa: BLE001 - any reason; reported in one line
            raise SeedLedgerError(
                f"worker {self.worker} on host {self.host} cannot open the ledger {display_location(url)}: "
                f"{' '.join(str(exc).split())}. With Ray on several machines the ledger must be "
                "a database every node reaches (e.g. a PostgreSQL URL), not a local SQLite file"
            ) from None
        try:
            anchors = Path(anchors_dir) if anchors_dir else None
            return self.replica.restore(ledger, run, generation, anchors)
        finally:
            ledger.close()

    def score_population(
        self, members: list[Member], sigma: float, generation: int, run_key: int, batch: Batch,
    ) -> list[Member]:
        """Score a contiguous chunk of members on the driver's batch; the same members back,
        scored (numbers and short texts: the weights never leave the actor)."""
        self._ready()
        if self.stall_at == generation:
            import time

            while True:  # a test kills this process here
                time.sleep(60)
        return self.replica.score_population(members, sigma, generation, run_key, batch=batch)

    def apply(self, step: ReplayStep) -> str:
        self._ready()
        fp = self.replica.apply(step)
        if self.diverge_at == step.index:
            import torch

            from seedledger.replay.fingerprint import fingerprint

            first = next(iter(self.replica.master.values())).view(-1)
            first[0] = torch.nextafter(first[0], torch.tensor(float("inf")))
            fp = fingerprint(self.replica.master)
        return fp

    def held_out_reward(self, limit: int) -> float:
        self._ready()
        return self.replica.held_out_reward(limit)

    def state(self):
        self._ready()
        return self.replica.master, self.replica.state
