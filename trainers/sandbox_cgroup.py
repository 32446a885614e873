"""Host side of the sandbox's cgroups: one directory per sandbox in every hierarchy we may
write (cgroup v1 cpuacct, memory, pids; or the v2 tree), bound into the cage at
``/sandbox/cg/<name>`` where the launcher makes one child per item
(``trainers/sandbox_cage.py``). Where none is writable (an ordinary user without
delegation) the cage falls back to no forking, said once in a one-line note."""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

SYS = Path("/sys/fs/cgroup")
_V1 = ("cpuacct", "memory", "pids")
_names = itertools.count()
_noted: list[bool] = []


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy ("unified" for v2) from /proc/self/cgroup."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            out["unified"] = path
        for c in controllers.split(","):
            if c in _V1:
                out[c] = path
    return out


def _hierarchies() -> dict[str, Path]:
    """Each usable hierarchy's directory for this process (a pure v2 mount wins)."""
    own = _own_paths()
    if (SYS / "cgroup.controllers").exists():  # pure cgroup v2
        return {"unified": SYS / own.get("unified", "/").lstrip("/")}
    found = {c: SYS / c / own[c].lstrip("/") for c in _V1 if c in own and (SYS / c).is_dir()}
    if "cpuacct" not in found and (SYS / "unified" / "cgroup.procs").exists():
        found["unified"] = SYS / "unified" / own.get("unified", "/").lstrip("/")
    return found


class SandboxCgroups:
    """The per-sandbox directories, made on start and removed on close."""

    def __init__(self, enabled: bool = True) -> None:
        self.dirs: dict[str, Path] = {}
        if not enabled:
            return
        name = f"seedledger-sandbox-{os.getpid()}-{next(_names)}"
        for kind, parent in _hierarchies().items():
            _remove_stale(parent)
            path = parent / name
            try:
                path.mkdir(exist_ok=True)
                if kind == "unified" and (path / "cgroup.controllers").exists():
                    wanted = set((path / "cgroup.controllers").read_text().split()) & {"memory", "pids"}
                    if wanted:
                        (path / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
            except OSError:
                continue
            self.dirs[kind] = path
        if "cpuacct" not in self.dirs and "unified" not in self.dirs:
            self.close()
            if not _noted:
                _noted.append(True)
                print("note: the sandbox has no writable cgroup: items may not fork, and one "
                      "process's RLIMIT_CPU/RLIMIT_AS bound each", file=sys.stderr)

    def binds(self) -> list[str]:
        """bwrap arguments that mount the directories at /sandbox/cg/<kind>, writable."""
        args = ["--dir", "/sandbox/cg"] if self.dirs else []
        for kind, path in self.dirs.items():
            args += ["--bind", str(path), f"/sandbox/cg/{kind}"]
        return args

    def close(self) -> None:
        """Remove the item directories the launcher left (it was killed) and our own; the
        launcher dies with bwrap a moment later, so empty cgroups may be busy briefly."""
        deadline = time.monotonic() + 2.0
        for path in self.dirs.values():
            while path.is_dir():
                for child in [c for c in path.iterdir() if c.is_dir()]:
                    _rmdir(child)
                if _rmdir(path) or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
        self.dirs = {}


def _remove_stale(parent: Path) -> None:
    """Remove the empty directories of sandboxes whose process died without closing."""
    try:
        stale = list(parent.glob("seedledger-sandbox-*-*"))
    except OSError:
        return
    for path in stale:
        try:
            os.kill(int(path.name.split("-")[2]), 0)
            continue  # its owner lives
        except ProcessLookupError:
            pass
        except (ValueError, OSError):
            continue
        for child in [c for c in path.iterdir() if c.is_dir()]:
            _rmdir(child)
        _rmdir(path)


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except OSError:
        return False
    return True
