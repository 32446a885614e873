"""Cost per sandbox item: the cage of issue 31 (cgroup per item, seccomp, nonce, wipes of
/tmp and /dev/shm) against the sandbox as it was at a git revision (default HEAD), and
against the cage's no-cgroup fallback, in the same run (rounds interleaved; the machine
is shared, so read the ratios).

    .venv/bin/python benchmarks/sandbox_bench.py [--items 40] [--rounds 3] [--rev REV]

REV defaults to the last commit before the cage (its sandbox is one launcher file).
"""

from __future__ import annotations

import argparse
import importlib.util
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

BEFORE_CAGE = "6e9131ec2933fea218f015cc16ce2388622d41ef"
ITEM = {"program": "def f(x):\n    return x + 1\n", "test": "assert f(1) == 2"}


def old_sandbox_class(rev: str, where: Path) -> type:
    """``Sandbox`` as it was at ``rev`` (its launcher beside it, as it expects)."""
    for name in ("sandbox.py", "sandbox_child.py"):
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:trainers/{name}"],
                              check=True, capture_output=True, text=True).stdout
        (where / name).write_text(text)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rev", default=BEFORE_CAGE)
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        print("sandbox_bench: skipped, bubblewrap (bwrap) is not installed (make sandbox)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        boxes = {"before": old_sandbox_class(args.rev, Path(tmp))(), "cage": Sandbox(),
                 "cage, no cgroups": Sandbox(cgroups=False)}
        for box in boxes.values():
            box.run("python", [ITEM], limits=Limits())  # start and warm up
        times: dict[str, list[float]] = {name: [] for name in boxes}
        for _ in range(args.rounds):
            for name, box in boxes.items():
                times[name].append(per_item(box, args.items))
        for box in boxes.values():
            box.close()
    base = statistics.median(times["before"])
    print(f"{args.items} items x {args.rounds} rounds, median per item:")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<18} {med * 1e3:7.2f} ms/item   x{med / base:5.2f} of before")


if __name__ == "__main__":
    main()
