"""A throw-away PostgreSQL server for tests and benchmarks: initdb into a temporary data
directory, start on a random loopback port, one fresh database per caller, stop and delete.

Debian's PostgreSQL (`initdb`, `pg_ctl` under /usr/lib/postgresql/<v>/bin; the Makefile
installs it where missing). PostgreSQL refuses to run as root, so as root the server runs
as the `postgres` system user (created by the Debian package) through `runuser`. Anything
that prevents a server raises PgUnavailable with the reason, which the tests print when
they skip.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

BIN_DIRS = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin")
SYSTEM_USER = "postgres"


class PgUnavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says why."""


def bin_dir() -> Path:
    """Where initdb and pg_ctl are: $PG_BINDIR, Debian's versioned directory, or PATH."""
    candidates = [os.environ.get("PG_BINDIR", ""), *BIN_DIRS]
    for d in candidates:
        if d and (Path(d) / "initdb").is_file() and (Path(d) / "pg_ctl").is_file():
            return Path(d)
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise PgUnavailable(
        "initdb/pg_ctl not found (install Debian's postgresql-15, or set PG_BINDIR)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One running server; `database()` gives a new empty database's SQLAlchemy URL."""

    def __init__(self, root: Path, port: int, run_as: str | None, bindir: Path):
        self.root, self.port, self.run_as, self.bindir = root, port, run_as, bindir
        self.data = root / "data"

    @classmethod
    def start(cls, root: str | os.PathLike[str] | None = None, *, fsync: bool = False) -> PgServer:
        """initdb + pg_ctl start. `fsync=False` (tests) trades crash durability of the
        throw-away server for speed; benchmarks pass True to measure real commits."""
        bindir = bin_dir()
        run_as = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(SYSTEM_USER)
            except KeyError:
                raise PgUnavailable(f"running as root and no {SYSTEM_USER!r} user to run the server") from None
            if shutil.which("runuser") is None:
                raise PgUnavailable("running as root and `runuser` is missing")
            run_as = SYSTEM_USER
        root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="seedledger-pg-"))
        root.mkdir(parents=True, exist_ok=True)
        if run_as:
            pw = pwd.getpwnam(run_as)
            os.chown(root, pw.pw_uid, pw.pw_gid)
            for parent in root.parents:  # the server user must reach its directory
                if parent.stat().st_mode & 0o001 == 0:
                    raise PgUnavailable(f"{parent} is not searchable by the {run_as!r} user")
        server = cls(root, 0, run_as, bindir)
        server._run("initdb", "-D", str(server.data), "-A", "trust", "-U", "postgres",
                    "--no-sync", "-E", "UTF8", "--locale=C")
        opts = (f"-c listen_addresses=127.0.0.1 -k {root} -c fsync={'on' if fsync else 'off'} "
                f"-c synchronous_commit={'on' if fsync else 'off'} -c full_page_writes={'on' if fsync else 'off'} "
                "-c max_connections=200")
        for _ in range(3):  # the port was free a moment ago; another process may take it
            server.port = _free_port()
            try:
                server._run("pg_ctl", "-D", str(server.data), "-l", str(root / "server.log"),
                            "-w", "-t", "60", "-o", f"{opts} -p {server.port}", "start")
                return server
            except PgUnavailable:
                continue
        raise PgUnavailable(f"pg_ctl start failed three times; see {root / 'server.log'}")

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        if self.run_as:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=self.root, timeout=120)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise PgUnavailable(f"{tool} failed: {' / '.join(tail)}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def database(self, prefix: str = "t") -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except PgUnavailable:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
