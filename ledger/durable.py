"""Durable file publication: after a rename, the directory entry must reach the disk too.

`os.replace(tmp, dest)` is atomic, but on POSIX the new name lives in the parent
directory, which has its own metadata: until the directory is fsynced, a power loss can
bring back the old name (or none). So: write tmp, fsync tmp, rename, fsync the directory.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory (no-op where directories cannot be opened, e.g. Windows)."""
    if os.name != "posix":
        return
    fd = os.open(Path(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(tmp: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """`os.replace(tmp, dest)`, then fsync dest's directory (tmp's data already synced)."""
    os.replace(tmp, dest)
    fsync_dir(Path(dest).parent)
