"""Cost per sandbox item: the sandbox now (issue 46: namespaces per item, a separate
grader for ``python``) against the sandbox at a git revision (default: the commit before
issue 46), and against the no-cgroup fallback, in the same run (rounds interleaved; the
machine is shared, so read the ratios). ``--fresh`` adds a fresh launcher per item (start,
one item, close), the alternative to a long-lived launcher; ``--unprivileged`` runs it
all as a non-root user (as root: the tests' ``sbxuser``), the path ordinary users get.

    .venv/bin/python benchmarks/sandbox_bench.py [--items 40] [--rounds 3] [--rev REV] [--fresh]
        [--unprivileged]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seedledger.trainers.sandbox import Limits, Sandbox  # noqa: E402

BEFORE_ROUND4 = "122525bb8e98747b1d24a8a8b7e1b4f3c2562311"
ITEM = {"program": "def f(x):\n    return x + 1\n", "test": "assert f(1) == 2"}


def old_sandbox_class(rev: str, where: Path) -> type:
    """``Sandbox`` as it was at ``rev``: every ``trainers/sandbox*.py`` of that commit,
    its host module loaded from there (the launcher's files beside it, as it expects)."""
    git = ["git", "-c", "safe.directory=*", "-C", str(ROOT)]
    names = subprocess.run([*git, "ls-tree", "--name-only", rev, "trainers/"], check=True,
                           capture_output=True, text=True).stdout.split()
    for name in (Path(n).name for n in names if Path(n).name.startswith("sandbox")):
        text = subprocess.run([*git, "show", f"{rev}:trainers/{name}"], check=True, capture_output=True,
                              text=True).stdout
        (where / name).write_text(text.replace("seedledger.trainers.sandbox_cgroup", "old_sandbox_cgroup"))
    if (where / "sandbox_cgroup.py").exists():
        (where / "sandbox_cgroup.py").rename(where / "old_sandbox_cgroup.py")
    sys.path.insert(0, str(where))
    spec = importlib.util.spec_from_file_location("old_sandbox", where / "sandbox.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_sandbox"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.Sandbox


def per_item(box: object, items: int) -> float:
    """Seconds per item of one request (the launcher already started)."""
    t = time.perf_counter()
    out = box.run("python", [ITEM] * items, limits=Limits())  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - t
    assert [o.status for o in out] == ["ok"] * items, out
    return elapsed / items


def fresh_per_item(items: int) -> float:
    """Seconds per item when every item gets a launcher of its own."""
    t = time.perf_counter()
    for _ in range(items):
        box = Sandbox()
        assert box.run("python", [ITEM], limits=Limits())[0].ok
        box.close()
    return (time.perf_counter() - t) / items


def as_user(argv: list[str]) -> None:
    """Run this benchmark again as the tests' non-root user."""
    from tests.support.sandbox import as_user as command_for

    command, env = command_for([sys.executable, *argv])
    raise SystemExit(subprocess.run(command, env=env, cwd="/").returncode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rev", default=BEFORE_ROUND4)
    parser.add_argument("--fresh", action="store_true", help="also a fresh launcher per item")
    parser.add_argument("--unprivileged", action="store_true", help="run as a non-root user")
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        print("sandbox_bench: skipped, bubblewrap (bwrap) is not installed (make sandbox)")
        return
    if args.unprivileged and os.geteuid() == 0:
        as_user([str(Path(__file__).resolve()), *[a for a in sys.argv[1:] if a != "--unprivileged"]])
    with tempfile.TemporaryDirectory() as tmp:
        boxes = {"before": old_sandbox_class(args.rev, Path(tmp))(), "now": Sandbox()}
        if os.geteuid() == 0:
            boxes["now, no cgroups"] = Sandbox(cgroups=False)
        for box in boxes.values():
            box.run("python", [ITEM], limits=Limits())  # start and warm up
        times: dict[str, list[float]] = {name: [] for name in boxes}
        if args.fresh:
            times["fresh launcher per item"] = []
        for _ in range(args.rounds):
            for name, box in boxes.items():
                times[name].append(per_item(box, args.items))
            if args.fresh:
                times["fresh launcher per item"].append(fresh_per_item(max(1, args.items // 4)))
        for box in boxes.values():
            box.close()
    base = statistics.median(times["before"])
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()} (unprivileged)"
    print(f"{args.items} items x {args.rounds} rounds as {who}, before = {args.rev[:12]}, median per item:")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<24} {med * 1e3:8.2f} ms/item   x{med / base:6.2f} of before")


if __name__ == "__main__":
    main()
