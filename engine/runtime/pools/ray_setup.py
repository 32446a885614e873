"""The Ray pool's pure parts: joining a cluster, sizing an actor, splitting the members,
and reading one worker's answer (engine/runtime/pools/ray.py holds the pool itself)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from seedledger.engine.config import TrainConfig
from seedledger.engine.runtime.pools import ReplicaMismatch
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.extras import require

FEATURE = "workers.pool: ray"
ray = require("ray", FEATURE)  # this module is imported only when a config asks for Ray
RayActorError, RayTaskError = ray.exceptions.RayActorError, ray.exceptions.RayTaskError

# A local cluster only moves keys and numbers per call; `state()` is the one large
# object and Ray spills what does not fit. Override with SEEDLEDGER_RAY_OBJECT_STORE.
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20


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

    On CUDA, `workers.gpus_per_worker` GPUs per actor (1: one replica per GPU; 0.5: two
    replicas share a GPU); on CPU the cluster's CPUs are split evenly so that W workers
    fit (fractions below 1, whole numbers above).
    """
    workers = cfg.workers.count
    if cfg.device.startswith("cuda"):
        return {"num_gpus": cfg.workers.gpus_per_worker, "num_cpus": 1}, 1
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


def check_agreement(fingerprints: Sequence[str], generation: int, workers: Sequence[int] | None = None) -> str:
    """The common fingerprint; ReplicaMismatch (exit 1) naming the first worker that differs
    (`workers`: the worker number of each fingerprint, default 0, 1, ...)."""
    names = list(workers) if workers is not None else list(range(len(fingerprints)))
    first = fingerprints[0]
    for worker, fp in zip(names, fingerprints, strict=True):
        if fp != first:
            raise ReplicaMismatch(
                f"worker {worker} has fingerprint {fp[:16]}… after generation {generation}, "
                f"worker {names[0]} has {first[:16]}…: the replicas disagree; aborting the run"
            )
    return first
