"""Provisioning a model alias into the cache, once: built in a temporary directory beside
its entry, given a manifest, synced and renamed into place under a file lock, with its
build steps shown (a spinner at a terminal, one line each in a log). Used by
engine.runtime.models.resolve, which decides when an entry needs it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from seedledger.engine.runtime.models.cache import (
    MANIFEST,
    MANIFEST_FORMAT,
    WEIGHTS,
    _safetensors_tensor_bytes,
    log,
    sha256_file,
)
from seedledger.ledger.durable import as_umask_allows, fsync_dir


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive file lock, so two processes do not provision the same alias at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _provision(alias: Any, entry: Path) -> None:
    """Build the alias into a temp dir beside `entry`, write the manifest, rename into place."""
    from rich.console import Console

    from seedledger.engine.runtime.console.terminal import interactive, line

    console = Console(stderr=True)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias.name}.tmp-", dir=entry.parent))
    title = f"provisioning model {alias.name!r} into {entry} (once)"
    if interactive():  # a spinner whose text follows the steps
        status = console.status(title)
        steps = _StepHandler(lambda msg: status.update(f"{title}: {msg}"))
    else:  # a log: one line per step
        line(title)
        status = contextlib.nullcontext()
        steps = _StepHandler(lambda msg: line(f"provisioning {alias.name!r}: {msg}"))
    log.addHandler(steps)
    log.setLevel(logging.INFO)
    try:
        with status:
            alias.build(tmp)
            log.info("writing the manifest and syncing to disk")
            weights = tmp / WEIGHTS
            size = weights.stat().st_size
            _, params = _safetensors_tensor_bytes(weights)
            manifest = {
                "format": MANIFEST_FORMAT,
                "alias": alias.name,
                "revision": alias.revision,
                "sha256": sha256_file(weights),
                "size": size,
                "params": params,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            for f in tmp.iterdir():  # data on disk before the rename makes it visible
                with f.open("rb") as fh:
                    os.fsync(fh.fileno())
            fsync_dir(tmp)  # ... and the entry's own file names
        as_umask_allows(tmp)  # mkdtemp (0700) and safetensors (0600) make it private; the cache is shared
        if entry.exists():  # a corrupt entry: move aside first, then drop it
            old = Path(tempfile.mkdtemp(prefix=f".{alias.name}.old-", dir=entry.parent))
            entry.rename(old / "entry")
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(entry)
        fsync_dir(entry.parent)  # the rename itself survives a power loss
    finally:
        log.removeHandler(steps)
        shutil.rmtree(tmp, ignore_errors=True)
    console.print(
        f"provisioned {alias.name!r}: {params:,} parameters, {size / 1e6:.0f} MB, "
        f"{time.perf_counter() - t0:.1f}s"
    )


class _StepHandler(logging.Handler):
    """Shows this module's INFO messages (the build's steps) while a model is provisioned."""

    def __init__(self, show: Callable[[str], None]):
        super().__init__(logging.INFO)
        self.show = show

    def emit(self, record: logging.LogRecord) -> None:
        self.show(record.getMessage())
