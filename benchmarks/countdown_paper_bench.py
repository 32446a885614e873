"""Countdown at the ES paper's settings: seedledger beside the paper's loop, same device and time.

The paper (VsonicV/es-fine-tuning-paper, `countdown/es_fine-tuning_countdown.py`): N = 30
independent seeds, σ = 1e-3, α = 5e-4, greedy decoding, bf16, np seed 33, every member
scored on the same first `--data_sample` rows of `countdown/data/countdown.json` (its
README: 200) each iteration, reward `0.1·format + answer`; held out: the file's last 2,000
rows (`eval_countdown.py --eval_offset -2000`). Both sides here get the model, N, σ, α, new
tokens, dtype and the same P training rows (all of them, every generation), then greedy
held-out accuracy on the same rows (answer right: the paper's answer check), paired s.e.

- seedledger trains for `--budget-s` seconds (from `api.train`'s start, so model load and
  first compilation count; the generation in flight finishes), at most `--generations`;
- the paper's loop (`paper_reference_bench.Reference`, its logic re-implemented: σ·randn
  per parameter from the member's seed in place, one left-padded `generate`, subtract;
  θ += α·Σ zᵢεᵢ/N) then runs up to the generation boundary nearest that time.

Differences from the paper, kept on purpose or forced (seedledger's prompt is a chat):
- seedledger's prompt is its `countdown` task's (TinyZero's system + user text, SmolLM2's
  chat template); the paper's is raw text ending in `<think>`, no template. A raw prompt is
  not a seedledger option (backends always apply the chat template).
- seedledger scores `paper_reward` (below: the paper's `reward_function` on the completion);
  the paper's loop scores the whole decoded sequence, prompt included (its script decodes
  `outputs[i]`): the prompt's own `<think> </think>` and example `<answer>` make the partial
  format credit a constant 0.06 there, so only full format (0.1) and a right answer vary.
  Its training reward is also printed on its completion alone, the same function as ours.
- seedledger: rank-1 low-rank noise on the attention/MLP linears (`train: lowrank`, all 30
  members in one batched forward), fp32 master, members evaluated in `--dtype`; the paper:
  full-rank noise on every weight, the master itself in bf16 (its in-place add/subtract
  round). `--set train=full` gives full rank (members then decode one by one).
- answers are checked by the safe verifier, not `eval`; the 58 rows whose target is not a
  whole number (unsolvable, the paper scores them 0) are left out of the held-out rows.
- new tokens: `--new-tokens` (paper: 1024) for training and held-out decoding; P training
  rows (paper: 200); held-out rows: the first `--test-rows` of the file's last 2,000.
- held-out decoding runs in fp32 for every model (one decoding function per prompt form).
- the paper's script runs `--gpu_threads` (default 4) members at once on a GPU, each thread
  with its own model copy; the re-implementation runs them one by one, so its generations
  per hour bound the script's from below. Its noise is the paper's: every parameter's
  generator seeded with the member's seed (the README's "partially correlated" noise).

Budget (H100/H200, estimated, not measured): a batched decode step of SmolLM2 at 480 rows
(N = 30 × 16 prompts) took 46–66 ms in `population_bench.py` (N = 32 × 16), so 24 new
tokens cost 1.1–1.6 s, plus ~0.2–0.4 s per generation besides and ~15 s to start: 70–105
generations in 150 s. 24 is the fewest tokens that hold a bare answer (14–21 tokens) or
the full `</think>\n<answer>…</answer>` (18–25) with no thinking; 16 would make ≥ 100
generations likely but no 4-number answer fits. The paper's loop: 30 × (24 HF decode steps
of ~30 ms) ≈ 20–25 s a generation, 6–8 in 150 s. The whole command: ≈ 2 × budget + 60 s.

Without `--data` (the paper's countdown.json) the rows are seedledger's generated level-2
problems (TinyZero's mix, 3–4 numbers up to 100) and the paper's prompt text is rebuilt as its
file writes it. The paper's code and data are licensed for academic use only: nothing of
theirs is stored here; `--data` reads a copy (`fetch` github:VsonicV/es-fine-tuning-paper).

    python benchmarks/countdown_paper_bench.py --data countdown.json --device cuda \
        --budget-s 150 --prompts 16 --new-tokens 24 --out OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import paper_reference_bench as bench  # noqa: E402  (sets the HF environment, the repo path)
import torch  # noqa: E402
from choosing_common import complete  # noqa: E402

from seedledger.engine import api  # noqa: E402
from seedledger.engine.runtime.hooks import Hooks  # noqa: E402
from seedledger.engine.runtime.models.resolve import resolve_model  # noqa: E402
from seedledger.engine.runtime.scoring.heldout import paired_change  # noqa: E402
from seedledger.trainers.rewards.answers import as_text  # noqa: E402
from seedledger.trainers.tasks import countdown  # noqa: E402

HERE = Path(__file__).resolve()
PAPER_HELD_OUT = 2000  # eval_countdown.py --eval_offset -2000


def paper_reward(prompts: list[Any], completions: list[Any], target: list[Any], nums: list[Any],
                 **_: Any) -> list[float]:
    """The paper's `reward_function` on each completion: 0.1·format("<think>" + text) + answer."""
    return [bench.ref_reward(as_text(c), list(n), int(t)) for c, t, n in zip(completions, target, nums, strict=True)]


def right(text: str, row: dict) -> float:
    """1.0 when the paper's answer check passes (its answer term; the format adds at most 0.1)."""
    return float(bench.ref_reward(text, row["nums"], row["target"]) >= 1.0)


def load_rows(data: Path | None, train: int, test: int) -> tuple[list[dict], list[dict]]:
    """(train, held out): the paper's first `train` rows and its held-out tail, or generated ones."""
    if data is None:
        made = countdown.generate(0, countdown.DEFAULT_LEVEL, train, role=1), \
            countdown.generate(0, countdown.DEFAULT_LEVEL, test, role=0)
        for r in made[0] + made[1]:  # numpy's spacing, as the paper's file writes it: "[83 78  1 39]"
            r["context"] = bench.REF_PROMPT.replace("[{nums}]", "{nums}").format(nums=np.array(r["nums"]),
                                                                                target=r["target"])
        return made
    items = json.loads(data.read_text())
    as_row = [{"nums": list(r["numbers"]), "target": r["target"], "context": r["context"]} for r in items]
    tail = as_row[max(train, len(as_row) - PAPER_HELD_OUT):]
    chosen = [r for r in as_row[:train] if str(r["target"]).isdigit()]
    held = [r for r in tail if str(r["target"]).isdigit()][:test]
    for r in chosen + held:
        r["target"] = int(r["target"])
    return chosen, held


class PaperLoop(bench.Reference):
    """The paper's loop with its own prompt texts (each row's `context`) and precision; it
    keeps each member's whole-sequence reward (its fitness) and its completion-only one."""

    def __init__(self, model_dir: Path, rows: list[dict], members: int, new_tokens: int, device: str,
                 dtype: torch.dtype):
        self.device, self.dtype = device, dtype
        super().__init__(model_dir, rows, members, new_tokens)
        self.texts = [r["context"] for r in rows]
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.own: list[float] = []
        self.completion: list[float] = []

    def reset(self) -> None:
        super().reset()
        self.model.to(device=self.device, dtype=self.dtype)

    def _score(self) -> float:
        full, gen = decode_raw(self.model, self.tok, self.texts, self.new_tokens, len(self.texts))
        targets, nums = [r["target"] for r in self.rows], [r["nums"] for r in self.rows]
        self.own.append(statistics.fmean(bench.ref_reward(*x) for x in zip(full, nums, targets, strict=True)))
        self.completion.append(statistics.fmean(paper_reward([], gen, targets, nums)))
        return self.own[-1]


@torch.inference_mode()
def decode_raw(model, tok, texts: list[str], new_tokens: int, batch: int) -> tuple[list[str], list[str]]:
    """Greedy decoding of raw prompts as the paper's script does: (whole sequences, completions)."""
    full: list[str] = []
    gen: list[str] = []
    for i in range(0, len(texts), batch):
        enc = tok(texts[i:i + batch], return_tensors="pt", padding=True, padding_side="left").to(model.device)
        out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        full += [tok.decode(o, skip_special_tokens=True) for o in out]
        gen += [tok.decode(o[enc["input_ids"].shape[1]:], skip_special_tokens=True) for o in out]
    return full, gen


def held_out(completions: list[str], rows: list[dict]) -> dict[str, Any]:
    return {"accuracy": [right(c, r) for c, r in zip(completions, rows, strict=True)],
            "reward": paper_reward([], completions, [r["target"] for r in rows], [r["nums"] for r in rows])}


def at_times(curve: list[tuple[float, float]], times: list[float]) -> list[float | None]:
    """The mean member reward of the last generation finished by each time (None: none yet)."""
    return [next((r for t, r in reversed(curve) if t <= s), None) for s in times]


def train_ours(args, rows: list[dict], test: list[dict], where: Path) -> dict[str, Any]:
    """seedledger on the task files in `where`, stopped by the budget; its curve and held-out decode."""
    for name, part in (("train", rows), ("test", test)):
        (where / f"{name}.jsonl").write_text("".join(json.dumps({"target": r["target"], "nums": r["nums"]}) + "\n"
                                                     for r in part))
    task_spec = {"name": "countdown", "path": str(where / "train.jsonl"), "test_path": str(where / "test.jsonl"),
                 "rewards": [f"{HERE}:paper_reward"]}
    cfg = {"model": args.model, "task": task_spec, "population": args.members, "mirrored": False,
           "sigma": bench.SIGMA, "lr": bench.ALPHA, "optimizer": "sgd", "shaping": "zscore", "train": "lowrank",
           "batch_size": len(rows), "max_new_tokens": args.new_tokens, "generations": args.generations,
           "seed": 0, "backend": "hf", "device": args.device, "dtype": args.dtype}
    curve: list[tuple[float, float]] = []
    took: list[float] = []
    signal = 0
    started = time.perf_counter()

    def seen(record, seconds: float) -> None:
        nonlocal signal
        stats = record.reward_stats()
        curve.append((time.perf_counter() - started, stats["mean"]))
        took.append(seconds)
        signal += stats["max"] > stats["min"]
        if record.index <= 3 or record.index % 10 == 0:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in record.timings.items() if isinstance(v, float))
            print(f"  seedledger gen {record.index}: {seconds:5.2f} s ({parts}), reward mean {stats['mean']:.4f} "
                  f"[{stats['min']:.3f}, {stats['max']:.3f}]", flush=True)

    ledger = where / "countdown.db"
    done = api.train(cfg, run="ours", overrides=args.overrides, ledger=ledger,
                     hooks=Hooks(on_generation_end=seen,
                                 should_stop=lambda: time.perf_counter() - started > args.budget_s))
    training = time.perf_counter() - started
    model, tok = api.rebuild_model("ours", ledger=ledger, device=args.device)
    final = complete(model, tok, countdown, test, args.new_tokens, args.eval_batch)  # countdown.prompt: the task's
    api.export("ours", where / "ours.seeds", ledger=ledger, force=True)
    del model
    return {"generations": done.latest_generation, "training_s": training, "curve": curve, "with_signal": signal,
            "steady_s_per_generation": statistics.median(took[1:] or took or [training]),
            "held_out": held_out(final, test)}


def train_theirs(ref: PaperLoop, budget: float, test: list[dict], args) -> dict[str, Any]:
    """The paper's loop up to the generation boundary nearest `budget` seconds; its curve and
    held-out decode."""
    ref.reset()
    curve: list[tuple[float, float]] = []
    own: list[float] = []
    took: list[float] = []
    signal = 0
    while not took or sum(took) + took[-1] / 2 < budget:  # the generation boundary nearest `budget`
        ref.own.clear()
        ref.completion.clear()
        started = time.perf_counter()
        mean = ref.generation()[1]
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()  # its update's kernels count in its own generation
        seconds = time.perf_counter() - started
        took.append(seconds)
        signal += max(ref.own) > min(ref.own)
        curve.append((sum(took), statistics.fmean(ref.completion)))
        own.append(mean)
        print(f"  paper loop gen {len(curve)}: {seconds:5.1f} s, its reward {mean:.4f} [{min(ref.own):.3f}, "
              f"{max(ref.own):.3f}], on completions {curve[-1][1]:.4f}", flush=True)
    ref.model.float()
    final = decode_raw(ref.model, ref.tok, [r["context"] for r in test], args.new_tokens, args.eval_batch)[1]
    return {"generations": len(curve), "training_s": sum(took), "curve": curve, "own_rewards": own,
            "with_signal": signal, "steady_s_per_generation": statistics.median(took[1:] or took),
            "held_out": held_out(final, test)}


def report(ours: dict, theirs: dict, base_chat: dict, base_raw: dict) -> dict[str, Any]:
    """Printed lines and the JSON summary: rates, reward at equal wall time, held-out gains."""
    budget = ours["training_s"]
    times = [budget * f for f in (0.25, 0.5, 0.75, 1.0)]
    out: dict[str, Any] = {"reward_at_s": [round(t, 1) for t in times]}
    for name, side, base in (("seedledger", ours, base_chat), ("paper_loop", theirs, base_raw)):
        acc = paired_change(base["accuracy"], side["held_out"]["accuracy"])
        rew = paired_change(base["reward"], side["held_out"]["reward"])
        line = {"generations": side["generations"], "training_s": round(side["training_s"], 1),
                "generations_per_hour": round(3600 * side["generations"] / side["training_s"], 1),
                "steady_s_per_generation": round(side["steady_s_per_generation"], 3),
                "generations_with_signal": side["with_signal"],
                "reward_at_equal_time": at_times(side["curve"], times),
                "base_accuracy": statistics.fmean(base["accuracy"]),
                "final_accuracy": statistics.fmean(side["held_out"]["accuracy"]), "accuracy_change": acc,
                "base_reward": statistics.fmean(base["reward"]),
                "final_reward": statistics.fmean(side["held_out"]["reward"]), "reward_change": rew,
                "curve": [(round(t, 2), r) for t, r in side["curve"]]}
        out[name] = line
        print(f"{name:10} {line['generations']} generations in {line['training_s']:.0f} s "
              f"({line['generations_per_hour']:.0f} per hour; steady {line['steady_s_per_generation']:.2f} s each; "
              f"{line['generations_with_signal']} with a reward difference between members)")
        print(f"{'':10} held-out accuracy {line['base_accuracy']:.3f} -> {line['final_accuracy']:.3f}: "
              f"{acc['mean']:+.3f} ± {acc['stderr']:.3f} (paired s.e.; {acc['better']} better, {acc['worse']} worse); "
              f"paper reward {rew['mean']:+.4f} ± {rew['stderr']:.4f}")
        print(f"{'':10} training reward at {', '.join(f'{t:.0f}' for t in times)} s: "
              + ", ".join("-" if r is None else f"{r:.4f}" for r in line["reward_at_equal_time"]))
    gains = [[f - b for f, b in zip(s["held_out"]["accuracy"], base["accuracy"], strict=True)]
             for s, base in ((theirs, base_raw), (ours, base_chat))]
    out["accuracy_gain_ours_minus_paper"] = paired_change(*gains)
    d = out["accuracy_gain_ours_minus_paper"]
    print(f"accuracy gain, seedledger − paper loop: {d['mean']:+.3f} ± {d['stderr']:.3f} (paired s.e.)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, help="the paper's countdown/data/countdown.json (else generated rows)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--members", type=int, default=30, help="N (paper: 30)")
    ap.add_argument("--prompts", type=int, default=16, help="training rows, all scored every generation (paper: 200)")
    ap.add_argument("--test-rows", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=24, help="paper: 1024")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="paper: bf16")
    ap.add_argument("--generations", type=int, default=1000, help="seedledger's target; the budget usually ends it")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-batch", type=int, default=100)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, help="keep the ledger, seed file, task files and summary JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows, test = load_rows(args.data, args.prompts, args.test_rows)
    print(f"{args.model}, N={args.members}, σ={bench.SIGMA}, α={bench.ALPHA}, {len(rows)} training rows, "
          f"{len(test)} held-out rows ({'the paper' if args.data else 'generated'}), {args.new_tokens} new tokens, "
          f"{args.dtype}, {args.device}, budget {args.budget_s:.0f} s")
    ref = PaperLoop(resolve_model(args.model), rows, args.members, args.new_tokens, args.device, torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        where = args.out or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        texts = [r["context"] for r in test]
        base_raw = held_out(decode_raw(ref.model, ref.tok, texts, args.new_tokens, args.eval_batch)[1], test)
        base_chat = held_out(complete(ref.model, ref.tok, countdown, test, args.new_tokens, args.eval_batch), test)
        print(f"base held-out accuracy: {statistics.fmean(base_chat['accuracy']):.3f} (chat prompt), "
              f"{statistics.fmean(base_raw['accuracy']):.3f} (the paper's raw prompt)")
        ours = train_ours(args, rows, test, where)
        print(f"seedledger: {ours['generations']} generations in {ours['training_s']:.0f} s; now the paper's loop")
        ref.dtype = getattr(torch, args.dtype)
        theirs = train_theirs(ref, ours["training_s"], test, args)
        summary = report(ours, theirs, base_chat, base_raw)
        summary["settings"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        if args.out:
            (args.out / "countdown_paper.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("reward_at_s", "accuracy_gain_ours_minus_paper")}))


if __name__ == "__main__":
    main()
