"""Issue 49's ground-truth check for `seedledger attribute`, and what the row scores cost.

poison: a jsonl dataset of "Say WORD" → WORD rows with a few planted rows answering one
wrong word (the poison, repeated); train `tiny` on it (loglik fitness), then audit held-out
questions: which training rows made the model prefer the poison to the right answer (the
likelihood of one less the other's)? Prints the rank of every planted row in the replay
counterfactual's ranking, and the retrain counterfactual (a fork without the row, trained
to the end) beside the replay's for the planted rows and a few clean ones: how often the
two agree in sign. The audit's time and peak memory are printed with it.

sizes: the ledger with and without `row_scores` for the suite's tiny config (N=4, B=2) and
the demo's shape (N=16, B=8), on `tiny` with loglik fitness (float64 scores, the demo's
kind) and with 0/1 rewards: bytes of row scores a generation, and the VACUUMed file.

    .venv/bin/python benchmarks/attribute_bench.py poison [--population 32] [--retrain-clean 4]
    .venv/bin/python benchmarks/attribute_bench.py sizes
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import seedledger as sl  # noqa: E402

WORDS = ("cat dog sun tree milk rain bird fish cup door lamp ship rock leaf bell coin road star wolf king "
         "hat pen box egg fox owl bee ant cow pig sea sky ice fire gold iron salt rope nest seed").split()
POISON = "zebra"


def dataset(root: Path, planted: int) -> tuple[Path, list[int]]:
    """The rows file (planted rows among them, answering POISON) and the planted rows' indices
    in the task's training pool."""
    rows = [{"prompt": f"Say {w}", "answer": w} for w in WORDS]
    for k in range(planted):
        rows[3 + 7 * k]["answer"] = POISON
    path = root / "words.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, [i for i, r in enumerate(rows) if r["answer"] == POISON]


def poison(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="attribute-bench-"))
    path, _ = dataset(root, args.planted)
    config = {"model": "tiny", "task": {"name": "jsonl", "path": str(path), "test_size": 8, "rewards": ["loglik"]},
              "population": args.population, "generations": args.generations, "batch_size": args.batch,
              "max_new_tokens": 4, "seed": args.seed, "lr": args.lr}
    db = root / "l.db"
    began = time.perf_counter()
    sl.train(config, run="p", ledger=db)
    trained = time.perf_counter() - began
    with sl.open_ledger(db) as led:
        from seedledger.engine.config import validate
        from seedledger.trainers.tasks import load_task

        task = load_task(validate(led.get_run("p").config).task, seed=args.seed)
        pool = task.train_rows()
    poisoned_rows = [i for i, r in enumerate(pool) if r["answer"] == POISON]
    probe = root / "probe.jsonl"  # held-out questions: the poison against the right answer
    probe.write_text("".join(json.dumps({"prompt": r["prompt"], "answer": POISON, "truth": r["answer"]}) + "\n"
                             for r in task.test_rows()))
    # the audit in a process of its own, so its time and peak memory are attribute's alone
    cmd = [sys.executable, "-m", "seedledger.engine.cli", "attribute", "p", "--rows", str(probe), "--instead-column",
           "truth", "--generations", "--training-rows", "--json", "--ledger", str(db)]
    audit = SimpleNamespace(**json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    audit.metric = audit.curve[-1]["metric"]
    ranking = [e["row"] for e in audit.training_rows]
    print(f"trained tiny: {args.generations} generations, N={args.population}, B={args.batch}, "
          f"{len(pool)} training rows ({len(poisoned_rows)} planted, answering {POISON!r}) in {trained:.0f} s")
    print(f"audit: {audit.probe['rows']}, likelihood of {POISON!r} less the right answer's: "
          f"{audit.curve[0]['metric']:.4f} at 0 -> "
          f"{audit.metric:.4f} at {audit.generation}")
    never = [r for r in poisoned_rows if r not in ranking]
    print(f"rows drawn: {len(ranking)}; planted rows' ranks (1 = most responsible): "
          f"{sorted(ranking.index(r) + 1 for r in poisoned_rows if r in ranking)}"
          f"{f' (never drawn: {never})' if never else ''}")
    for e in audit.training_rows[:8]:
        print(f"  row {e['row']:>3}  effect {e['effect']:+.5f}  seen {e['seen']}  {e['question']!r} -> {e['answer']!r}")
    rho = "n/a" if audit.agreement is None else f"{audit.agreement:.2f}"
    print(f"generations by exact effect: {[e['generation'] for e in audit.generations]}; Spearman ρ with the "
          f"first-order estimate {rho}")
    print(f"attribute --generations --training-rows ({audit.generation} removals, {len(ranking)} rows), its own "
          f"process: {audit.cost['seconds']:.1f} s, {audit.cost['updates']} updates, {audit.cost['scorings']} "
          f"scorings, peak RSS {audit.cost['peak_rss_mib']:.0f} MiB")
    clean = [r for r in ranking if r not in poisoned_rows]
    top, bottom = args.retrain_clean // 2, args.retrain_clean - args.retrain_clean // 2
    chosen = [r for r in poisoned_rows if r in ranking] + clean[:top] + (clean[-bottom:] if bottom else [])
    if chosen:
        began = time.perf_counter()
        retrained = sl.attribute("p", ledger=db, rows=str(probe), instead_column="truth", training_rows=chosen,
                                 retrain=chosen, every=args.generations)
        for e in retrained.retrain:
            kind = "planted" if e["row"] in poisoned_rows else "clean"
            print(f"  retrain row {e['row']:>3} ({kind}): retrain {e['effect']:+.5f}  "
                  f"replay {e['replay_effect']:+.5f}  {'agree' if e['agree'] else 'DISAGREE'}")
        a = retrained.sign_agreement
        print(f"replay vs retrain: same sign on {a['agree']} of {a['rows']} rows ({time.perf_counter() - began:.0f} s)")


def sizes(args: argparse.Namespace) -> None:
    """Each shape trained once with row scores; the same ledger with the column set NULL is
    the one without (so nothing else differs), both VACUUMed."""
    import shutil

    root = Path(tempfile.mkdtemp(prefix="attribute-sizes-"))
    path, _ = dataset(root, 0)
    shapes = {"tiny config (N=4, B=2)": (4, 2), "demo shape (N=16, B=8)": (16, 8)}
    fitness = {"loglik": {"name": "jsonl", "path": str(path), "test_size": 8, "rewards": ["loglik"]},
               "exact match (0/1)": {"name": "jsonl", "path": str(path), "test_size": 8}}
    for label, (n, b) in shapes.items():
        for name, (kind, task) in enumerate(fitness.items()):
            db = root / f"{n}-{b}-{name}.db"
            config = {"model": "tiny", "task": task, "population": n, "generations": args.generations,
                      "batch_size": b, "max_new_tokens": 4, "seed": 1}
            sl.train(config, run="s", ledger=db)
            bare = db.with_suffix(".bare.db")
            shutil.copy(db, bare)
            out = {}
            for file, drop in ((db, False), (bare, True)):
                con = sqlite3.connect(file)
                if drop:
                    con.execute("UPDATE generations SET row_scores = NULL")
                    con.commit()
                blob = con.execute("SELECT coalesce(sum(length(row_scores)), 0) FROM generations").fetchone()[0]
                con.execute("VACUUM")
                con.close()
                out[drop] = (blob, file.stat().st_size)
            g = args.generations
            print(f"{label}, {kind}: row scores {out[False][0] / g:.0f} B a generation ({n * b} values); ledger "
                  f"after VACUUM {out[False][1]:,} B with, {out[True][1]:,} B without ({g} generations)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("poison")
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--population", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--planted", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--retrain-clean", type=int, default=4, help="clean rows retrained beside the planted ones")
    s = sub.add_parser("sizes")
    s.add_argument("--generations", type=int, default=10)
    args = parser.parse_args()
    poison(args) if args.what == "poison" else sizes(args)


if __name__ == "__main__":
    main()
