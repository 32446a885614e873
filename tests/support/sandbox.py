"""Tests that need bubblewrap: they skip, with the reason printed, where it cannot exist,
and fail loudly in CI (``CI`` set), where ``make test`` installs it.

``UserBox`` is the sandbox an ordinary user gets (no root: bwrap's user namespace, no
cgroups), served from a process that runs as a real non-root user. Run as root (as CI
is), it makes that user (``sbxuser``) when missing and reaches it through ``setpriv``
inside a mount namespace where the Python installation and the checkout are reachable
(``/root`` is often 0700); run as anyone else, the suite's own sandbox already is that
path, and ``user_box`` skips saying so.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER = "sbxuser"


def need_bwrap() -> None:
    """Skip (or, in CI, fail) when the ``bwrap`` binary is missing."""
    if shutil.which("bwrap") is not None:
        return
    reason = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI runs `make test`, which installs it)")
    pytest.skip(reason)


def _user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        pytest.skip(f"no user {USER!r} and no useradd to make one")
    subprocess.run(["useradd", "-m", USER], check=True, capture_output=True)
    return pwd.getpwnam(USER)


def _reachable(paths: list[Path]) -> list[str]:
    """bwrap arguments that make ``paths`` reachable by others: each directory on the way
    that others may not search becomes a 0755 tmpfs holding only the next step, bound."""
    args: list[str] = []
    replaced: set[Path] = set()
    bound: set[Path] = set()
    for path in paths:
        parts = path.resolve().parts
        for i in range(1, len(parts)):
            here, step = Path(*parts[:i]), Path(*parts[: i + 1])
            if here not in replaced and not here.stat().st_mode & stat.S_IXOTH:
                replaced.add(here)
                args += ["--perms", "0755", "--tmpfs", str(here)]
            if here in replaced and step not in bound:
                bound.add(step)
                args += ["--dev-bind", str(step), str(step)]
    return args


def as_user(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``argv`` as the non-root user (we are root)."""
    need_bwrap()
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is missing: cannot run as a non-root user")
    user = _user()
    paths = [Path(sys.base_prefix), Path(sys.prefix), Path(sys.executable).resolve().parent, ROOT]
    command = [str(shutil.which("bwrap")), "--die-with-parent", "--dev-bind", "/", "/", *_reachable(paths),
               "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
               str(shutil.which("setpriv")), f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
               "--", *argv]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": user.pw_dir, "LANG": "C.UTF-8",
           **{k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "CI")}}
    return command, env


_SERVE = """
import json, sys
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.sandbox import Limits, Sandbox
box = Sandbox()
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["op"] == "ping":
            answer = {"uid": box.ping()}
        else:
            out = box.run(req["job"], req["items"], limits=Limits(**req["limits"]), setup=req["setup"])
            answer = {"outcomes": [[o.status, o.value, o.error] for o in out]}
    except SeedLedgerError as exc:
        answer = {"error": str(exc)}
    answer["starts"] = box.starts
    print(json.dumps(answer), flush=True)
box.close()
"""


def _user_coverage() -> tuple[Path, Path] | None:
    """Under ``make coverage``: a directory the user may write, holding a configuration for
    its server (whose sandbox then measures its cage: trainers/sandbox_coverage.py), and
    this process's data file, where its data goes on ``close``; else None."""
    from seedledger.trainers.sandbox_coverage import measured

    found = measured()
    if found is None:
        return None
    data_file, branch = Path(found[0]), found[1]
    root = Path(tempfile.mkdtemp(prefix="seedledger-user-coverage-"))
    root.chmod(0o1777)
    (root / "coveragerc").write_text(f"[run]\nparallel = True\nbranch = {branch}\ndata_file = {root / data_file.name}\n"
                                     f"include = {ROOT}/trainers/sandbox*.py\n")
    return root, data_file


class UserBox:
    """A ``Sandbox`` in a process of the non-root user: ``run``, ``ping`` and ``starts``
    as the real one's (outcomes come back as ``Outcome``; a refusal as SeedLedgerError)."""

    def __init__(self, extra_path: str | None = None) -> None:
        command, env = as_user([sys.executable, "-c", _SERVE])
        if extra_path:
            env["PATH"] = f"{extra_path}:{env['PATH']}"
        self._coverage = _user_coverage()
        if self._coverage is not None:  # make coverage: the user's server measures itself and its cage
            env["COVERAGE_PROCESS_START"] = str(self._coverage[0] / "coveragerc")
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                      env=env, cwd="/", text=True)
        self.starts = 0

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        from seedledger.ledger.errors import SeedLedgerError

        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            self._stderr.seek(0)
            raise RuntimeError(f"the non-root sandbox server died: {self._stderr.read().decode()[-2000:]}")
        answer = json.loads(line)
        self.starts = answer["starts"]
        if "error" in answer:
            raise SeedLedgerError(answer["error"])
        return answer

    def ping(self) -> int:
        return int(self._ask({"op": "ping"})["uid"])

    def run(self, job: str, items: list[dict[str, Any]], *, limits: Any = None,
            setup: dict[str, Any] | None = None) -> list[Any]:
        from seedledger.trainers.sandbox import Limits, Outcome

        lim = limits if limits is not None else Limits()
        fields = {k: getattr(lim, k) for k in Limits.__dataclass_fields__}
        answer = self._ask({"op": "run", "job": job, "items": items, "limits": fields, "setup": setup})
        return [Outcome(*o) for o in answer["outcomes"]]

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._stderr.close()
        if self._coverage is not None:
            from seedledger.trainers.sandbox_coverage import move_data

            move_data(self._coverage[0], self._coverage[1])
            shutil.rmtree(self._coverage[0], ignore_errors=True)


def user_box(extra_path: str | None = None) -> UserBox:
    """The non-root sandbox; skips where the tests already run as an ordinary user."""
    if os.geteuid() != 0:
        pytest.skip("the suite already runs as an ordinary user: its own sandbox is the unprivileged path")
    return UserBox(extra_path)
