"""Durable file publication: after a rename, the directory entry must reach the disk too.

`os.replace(tmp, dest)` is atomic, but on POSIX the new name lives in the parent
directory, which has its own metadata: until the directory is fsynced, a power loss can
bring back the old name (or none). So: write tmp, fsync tmp, rename, fsync the directory.
Whatever seedledger writes for the user (seed files, rebuilt models) never lands on a
ledger: an SQLite database is recognised by its header, whatever its name.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from seedledger.ledger.errors import SeedLedgerError


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


def current_umask() -> int:
    """The process umask, read without changing it where Linux says (/proc), else by the
    set-and-restore dance."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_umask_allows(path: str | os.PathLike[str]) -> None:
    """Give `path` (and, for a directory, everything in it) the mode an ordinary `open` /
    `mkdir` would have given it under the umask: temporary files and directories are made
    private (0600 / 0700), and what seedledger publishes for people (seed files, rebuilt
    models, the model cache) must be as shareable as the user's umask says."""
    mask = current_umask()
    root = Path(path)
    todo = [root]
    while todo:
        p = todo.pop()
        st = os.stat(p, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(p, 0o777 & ~mask)
            todo += list(p.iterdir())
        elif stat.S_ISREG(st.st_mode):
            os.chmod(p, (0o777 if st.st_mode & 0o111 else 0o666) & ~mask)


SQLITE_HEADER = b"SQLite format 3\x00"
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")


def is_sqlite_file(path: str | os.PathLike[str], follow_symlinks: bool = True) -> bool:
    """True when `path` is a regular file that starts like an SQLite database (a ledger).

    Only regular files are opened: reading a FIFO or a device could block or never end."""
    try:
        if not stat.S_ISREG(os.stat(path, follow_symlinks=follow_symlinks).st_mode):
            return False
        with open(path, "rb") as fh:
            return fh.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def holds_ledger(path: Path) -> bool:
    """True when `path` is an SQLite database or the WAL/journal beside one: overwriting
    either destroys a ledger's history."""
    if is_sqlite_file(path):
        return True
    name = path.name
    return any(
        name.endswith(s) and is_sqlite_file(path.with_name(name[: -len(s)])) for s in SQLITE_SIDECARS
    )


def check_file_target(dest: Path, force: bool = False) -> None:
    """Refuse to write `dest` where that would destroy something: a directory, anything
    that is not a regular file, an SQLite database or its sidecar files (even with
    `force`: a ledger is never written over), and without `force` any existing file."""
    label = f"-o {dest}"
    try:
        mode = os.stat(dest).st_mode
    except FileNotFoundError:
        if os.path.lexists(dest) and not force:  # a dangling symlink
            raise SeedLedgerError(f"{label}: exists; pass --force to replace it") from None
        return
    except OSError as exc:
        raise SeedLedgerError(f"{label}: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise SeedLedgerError(f"{label}: is a directory; name the file to write")
    if holds_ledger(dest):
        raise SeedLedgerError(f"{label}: is an SQLite database (a ledger); seedledger never writes over one")
    if not stat.S_ISREG(mode):
        raise SeedLedgerError(f"{label}: is not a regular file")
    if not force:
        raise SeedLedgerError(f"{label}: exists; pass --force to replace it")


def disk_full(exc: BaseException) -> bool:
    """ENOSPC, as an OSError or as a library's wrapped message (safetensors says
    "No space left on device (os error 28)")."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "No space left on device" in text or "os error 28" in text


def write_error(label: str, exc: BaseException) -> SeedLedgerError:
    """One line for a write that failed (full disk, no permission): nothing was left."""
    why = "no space left on device" if disk_full(exc) else getattr(exc, "strerror", None) or str(exc)
    return SeedLedgerError(f"{label}: cannot write it: {why}; nothing was left behind")


def write_file_durably(dest: Path, data: bytes, force: bool = False) -> None:
    """Publish `data` at `dest` whole or not at all: a temporary file in the same directory,
    fsynced, then renamed over `dest` and the directory fsynced. `check_file_target` runs
    first and again just before the rename (for anything that appeared meanwhile). A write
    that fails (a full disk) removes the temporary file and raises one line."""
    tmp = stage_file(dest, data, force)
    try:
        publish_file(tmp, dest, force)
    finally:
        tmp.unlink(missing_ok=True)


def stage_file(dest: Path, data: bytes, force: bool = False) -> Path:
    """`data` in a temporary file beside `dest`, fsynced, not yet published (`publish_file`
    renames it; the caller removes it if it never does). `check_file_target` runs first."""
    check_file_target(dest, force)
    try:
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    except OSError as exc:  # a missing or read-only directory: the user's to fix
        raise SeedLedgerError(f"-o {dest}: cannot write in {dest.parent}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0600 is for temporary files
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:  # e.g. a full disk
        Path(tmp).unlink(missing_ok=True)
        raise write_error(f"-o {dest}", exc) from None
    return Path(tmp)


def publish_file(tmp: Path, dest: Path, force: bool = False) -> None:
    """Rename staged `tmp` over `dest` (checked again first) and fsync the directory."""
    try:
        check_file_target(dest, force)
        replace_durably(tmp, dest)
    except OSError as exc:
        raise write_error(f"-o {dest}", exc) from None


def remove_durably(path: Path) -> None:
    """Unlink `path` if it is there, and fsync its directory: the removal reaches the disk
    before whatever the caller publishes next."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
