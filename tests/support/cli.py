"""`seedledger ARGS` for the tests: in this process by default, in a subprocess where the
process boundary is what is tested.

A console-script start pays ~10 s of imports (torch, transformers) before a model-loading
command does anything; the suite makes hundreds of calls, so they run in the test's own
process through `engine.cli.main(argv)`, with what a process would have fresh set fresh:
the environment, the working directory, stdout and stderr at the file-descriptor level (so
library and child-process output is captured as a pipe would), the CLI's root options,
warning filters and hooks, signal handlers, `sys.path` and user modules imported from the
working directory. The result is a `subprocess.CompletedProcess`, as from the real script.

A call runs in a subprocess instead when its environment arms a failpoint (a SIGKILL would
end the test's process) or the caller asks (`process=True`: signals, the console script's
own exit code, environment handling). `SEEDLEDGER_TEST_SUBPROCESS=1` runs every call in a
subprocess, to check that the two agree.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVERY_CALL_IN_A_SUBPROCESS = os.environ.get("SEEDLEDGER_TEST_SUBPROCESS") == "1"
# environment variables that only mean something to a fresh process
PROCESS_ONLY = ("SEEDLEDGER_FAILPOINT",)


def script() -> list[str]:
    """The installed console script (or `python -m` where there is none)."""
    found = Path(sys.executable).with_name("seedledger")
    return [str(found)] if found.exists() else [sys.executable, "-m", "seedledger.engine.cli"]


def seedledger(
    args: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    process: bool = False,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """Run `seedledger ARGS` in `cwd` with environment `env` (default: this process's);
    never raises for a non-zero exit: the caller checks `returncode`."""
    argv = [os.fspath(a) for a in args]
    env = dict(os.environ if env is None else env)
    if process or EVERY_CALL_IN_A_SUBPROCESS or any(env.get(name) for name in PROCESS_ONLY):
        # the tests' own modules (`tests.support.rewards:…` in configs) import there as here
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        return subprocess.run(
            [*script(), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    return in_process(argv, cwd=cwd, env=env)


def in_process(argv: list[str], *, cwd, env: Mapping[str, str]) -> subprocess.CompletedProcess:
    """`main(argv)` here, as the console script would run it (module docstring)."""
    from seedledger.engine.cli import main

    with _fresh_process_state(cwd, env), _captured() as output:
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except Exception:  # the interpreter's own handling of an uncaught exception
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(["seedledger", *argv], code, output.stdout, output.stderr)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"), as the interpreter prints it
    return 1


class _Output:
    stdout = ""
    stderr = ""


@contextlib.contextmanager
def _captured() -> Iterator[_Output]:
    """stdout and stderr captured at the file descriptors (what children and C code write
    too), with `sys.stdout`/`sys.stderr` text streams on them, as a pipe would see them."""
    output = _Output()
    saved_streams = sys.stdout, sys.stderr
    for stream in saved_streams:
        with contextlib.suppress(Exception):
            stream.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        saved_fds = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        # streams on the descriptors themselves, never closed: a logging handler made during
        # the call (transformers', vLLM's) keeps a stream that still works after it
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", errors="backslashreplace")
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), encoding="utf-8", errors="backslashreplace",
                                      line_buffering=True)
        try:
            yield output
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            out.seek(0)
            err.seek(0)
            output.stdout = out.read().decode("utf-8", errors="backslashreplace")
            output.stderr = err.read().decode("utf-8", errors="backslashreplace")


@contextlib.contextmanager
def _fresh_process_state(cwd, env: Mapping[str, str]) -> Iterator[None]:
    """What a new process starts with, set for the call and put back after it."""
    from seedledger.engine.cli.app import State
    from seedledger.engine.runtime.console import interrupts

    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_path = list(sys.path)
    saved_modules = set(sys.modules)
    saved_hooks = warnings.formatwarning, warnings.showwarning, sys.unraisablehook, sys.excepthook
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    os.environ.clear()
    os.environ.update(env)
    workdir = Path(cwd or ROOT).resolve()
    os.chdir(workdir)
    State.debug, State.upgrade = False, True
    interrupts._pending = None
    try:
        with warnings.catch_warnings():
            _python_default_warning_filters()
            warnings.showwarning = _show_on_stderr  # pytest records warnings; a process prints them
            yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        warnings.formatwarning, warnings.showwarning, sys.unraisablehook, sys.excepthook = saved_hooks
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        interrupts._pending = None
        _forget_user_modules(saved_modules)


def _python_default_warning_filters() -> None:
    """The filters a fresh interpreter starts with (no -W, no PYTHONWARNINGS): pytest's own
    would show warnings that a user of the console script never sees."""
    warnings.resetwarnings()
    for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
        warnings.simplefilter("ignore", category)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")


def _show_on_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    """What a fresh interpreter does with a warning: its formatted text on stderr."""
    (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


def _forget_user_modules(before: set[str]) -> None:
    """Drop modules the call imported from outside the installed code (a reward module or a
    model factory in the test's directory), so the next call imports its own file anew."""
    installed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, ROOT)}
    for name in set(sys.modules) - before:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file and not any(Path(file).resolve().is_relative_to(p) for p in installed):
            del sys.modules[name]
