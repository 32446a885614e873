"""The largest model each method trains under a fixed memory cap (docs/choosing.md, "Memory
under a cap"): each method's first training steps, in a process tree held by a cgroup-v1
memory limit, on SmolLM2-135M-Instruct and on random-weight models with SmolLM2-360M's and
SmolLM2-1.7B's architectures (memory depends on the shapes, not the values; no hub access
here, so the larger models' real weights are out of reach).

Methods, each on the reward demo's task (engine/configs/reward.yaml, the `number` verifier):
- `seedledger`: `seedledger train` with the config's kind (rank-1 low-rank members, fp32
  master), one generation (its first update included);
- `seedledger-int8`: the same with `train: quant_codes` (int8 codes, full-rank members, SGD:
  no moments), σ 1e-3 and lr 5e-4 as docs/quantized.md suggests, one generation (the
  first update quantizes the master);
- `grpo`: TRL's GRPOTrainer, full fine-tuning with AdamW (benchmarks/grpo_bench.py), one
  step (its moments allocated).
The sizes of work are equal and small (`--population`/`--group` 4, 4 rows a step, 12 new
tokens, 2 held-out rows for GRPO's verdict): the cap is about what a method must hold,
weights, gradients, optimizer moments and activations, not about throughput.

A run fits when it exits 0 under the cap; one that the kernel kills (OOM) or that fails
does not. The page cache is dropped before each run, so the model files a method reads are
charged to its cgroup (reclaimable page cache: it counts in the peak, never kills).
Printed per run: the exit, the seconds, the cgroup's peak (memory.max_usage_in_bytes, page
cache included) and the process tree's peak RSS (`os.wait4`).

Needs root (it creates /sys/fs/cgroup/memory/seedledger-cap) and TRL (requirements/bench.txt):

    .venv/bin/python benchmarks/memory_cap_bench.py [--cap-gib 6] [--sizes 135M 360M 1.7B]
        [--methods seedledger seedledger-int8 grpo]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CGROUP = Path("/sys/fs/cgroup/memory/seedledger-cap")
# SmolLM2's published architectures (config.json of HuggingFaceTB/SmolLM2-360M and -1.7B).
SHAPES = {
    "360M": {"hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32,
             "num_attention_heads": 15, "num_key_value_heads": 5},
    "1.7B": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
             "num_attention_heads": 32, "num_key_value_heads": 32},
}
SMALL = ["population=4", "batch_size=4", "max_new_tokens=12", "evaluation.rows=2"]


def model_dir(size: str, cache: Path) -> Path:
    """SmolLM2-135M's directory for 135M; else a random-weight model of that architecture,
    built once under `cache` (by the preparing child process, outside the cap)."""
    sys.path.insert(0, str(ROOT))
    from seedledger.engine.runtime.models.resolve import resolve_model

    real = resolve_model("smollm2-135m-instruct")
    if size == "135M":
        return real
    dest = cache / f"smollm2-{size}-random"
    if (dest / "model.safetensors").is_file() or (dest / "model.safetensors.index.json").is_file():
        return dest
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from random_model import build

    n = build(real, dest, 0, **SHAPES[size])
    print(f"built {dest}: {n / 1e6:.0f}M random parameters", flush=True)
    return dest


def prepared(sizes: list[str], cache: Path) -> dict[str, Path]:
    """Each size's model directory, found or built in a child process: this one stays small,
    since a child inherits its parent's peak RSS across fork and exec (`ru_maxrss`)."""
    out = subprocess.run([sys.executable, __file__, "--prepare", *sizes, "--models", str(cache)], cwd=ROOT,
                         check=True, stdout=subprocess.PIPE, text=True).stdout.splitlines()
    pairs = (line.split("\t") for line in out if "\t" in line)
    return {size: Path(path) for size, path in pairs}


def command(method: str, model: Path, work: Path) -> list[str]:
    """The method's first steps on `model`, as a user runs them."""
    sets = [f"model={model}", *SMALL]
    if method == "grpo":
        return [sys.executable, str(ROOT / "benchmarks/grpo_bench.py"), "--config", "reward", "--seconds", "1",
                "--steps", "1", "--rows", "2", "--group", "4", *[f"--set={s}" for s in sets]]
    if method == "seedledger-int8":
        sets += ["train=quant_codes", "sigma=0.001", "lr=0.0005", "optimizer=sgd"]
    return [str(ROOT / ".venv/bin/seedledger"), "train", str(ROOT / "engine/configs/reward.yaml"),
            "--ledger", str(work / "cap.db"), "--run", "cap", *[f"--set={s}" for s in [*sets, "generations=1"]]]


def capped(cmd: list[str], cap: int, log: Path) -> dict:
    """Run `cmd` inside the cgroup limited to `cap` bytes (swap none): exit, seconds, peaks."""
    if CGROUP.exists():
        CGROUP.rmdir()
    CGROUP.mkdir()
    (CGROUP / "memory.limit_in_bytes").write_text(str(cap))
    memsw = CGROUP / "memory.memsw.limit_in_bytes"
    if memsw.exists():
        memsw.write_text(str(cap))
    Path("/proc/sys/vm/drop_caches").write_text("1")  # the model files are read (and charged) inside the cap
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(["sh", "-c", f'echo $$ > {CGROUP}/cgroup.procs && exec "$@"', "capped", *cmd],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    peak = int((CGROUP / "memory.max_usage_in_bytes").read_text())
    oom = "oom_kill 1" in (CGROUP / "memory.oom_control").read_text() or os.WIFSIGNALED(status)
    CGROUP.rmdir()
    code = os.waitstatus_to_exitcode(status)
    return {"exit": code, "oom": oom, "seconds": seconds, "cgroup_peak_mib": peak / 2**20,
            "rss_peak_mib": usage.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap-gib", type=float, default=6.0)
    ap.add_argument("--sizes", nargs="+", default=["135M", "360M", "1.7B"], choices=["135M", *SHAPES])
    ap.add_argument("--methods", nargs="+", default=["seedledger", "seedledger-int8", "grpo"],
                    choices=["seedledger", "seedledger-int8", "grpo"])
    ap.add_argument("--models", type=Path, default=ROOT / "bench-out/cap-models", help="where random models are kept")
    ap.add_argument("--logs", type=Path, default=ROOT / "bench-out/cap-logs")
    ap.add_argument("--prepare", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prepare:  # the child `prepared` runs: one "size<TAB>directory" line per size
        for size in args.prepare:
            print(f"{size}\t{model_dir(size, args.models)}", flush=True)
        return
    if os.geteuid() != 0:
        raise SystemExit("memory_cap_bench.py needs root: it creates a cgroup-v1 memory limit")
    cap = int(args.cap_gib * 2**30)
    args.logs.mkdir(parents=True, exist_ok=True)
    models = prepared(args.sizes, args.models)
    rows = []
    for size in args.sizes:
        for method in args.methods:
            with tempfile.TemporaryDirectory() as work:
                log = args.logs / f"{method}-{size}.log"
                r = capped(command(method, models[size], Path(work)), cap, log)
            verdict = "fits" if r["exit"] == 0 else ("killed (OOM)" if r["oom"] else f"failed ({r['exit']})")
            rows.append((size, method, verdict, r))
            print(f"{size:>5} {method:<16} {verdict:<14} {r['seconds']:7.0f} s"
                  f"  cgroup peak {r['cgroup_peak_mib']:8,.0f} MiB  RSS peak {r['rss_peak_mib']:8,.0f} MiB"
                  f"  ({log})", flush=True)
    print(f"\ncap {args.cap_gib:g} GiB; the largest model that fits, per method:")
    for method in args.methods:
        fits = [size for size, m, v, _ in rows if m == method and v == "fits"]
        print(f"  {method:<16} {fits[-1] if fits else 'none'}")


if __name__ == "__main__":
    main()
