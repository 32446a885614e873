"""Seconds per ES generation: the ES paper's own loop beside seedledger, same run, interleaved.

The reference (VsonicV/es-fine-tuning-paper, `countdown/es_fine-tuning_countdown.py`) is
re-implemented here from its logic, not copied: per member, every parameter gets
`σ·randn(shape)` from a `torch.Generator` seeded with the member's seed (in place), all
prompts decode in one left-padded greedy `generate`, the reward is scored, and the same
noise is regenerated and subtracted. The update regenerates each member's noise once more
per parameter: `θ += α · Σ_m z_m·ε_m / N` with z the rewards' z-score (`std + 1e-8`).
Seeds come from `np.random.seed(33)`, `randint(0, 2**30, N)` per generation.

Same model, problems, N, σ, α and new tokens on both sides. Differences (kept, they are
the systems' own): the reference prompt is its raw text ending in `<think>` (no chat
template; numbers single-spaced, where the paper's file pads them as numpy prints them,
which countdown_paper_bench.py keeps) and its reward is `0.1·format + answer` scored on the *whole decoded sequence*
(prompt included, as its script decodes `outputs[i]`: so the prompt's own `<think>` and
example `<answer>` give every row ≥ 0.06); seedledger uses its countdown task (TinyZero's
chat prompt and score: 0 / 0.1 / 1), mirrored pairs, and its ledger. The reference answer
is checked with our safe verifier instead of `eval`.

Interleaving: the reference generation runs inside seedledger's end-of-generation hook,
so each of ours is followed by one of the reference's and machine load hits both alike.
Steady state drops each path's first generation (model load, warm-up).

    .venv/bin/python benchmarks/paper_reference_bench.py [--members 8] [--prompts 16]
        [--new-tokens 64] [--generations 3] [--threads 2] [--paths default full lowrank vllm vllm-full]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from seedledger.engine import api  # noqa: E402
from seedledger.engine.config_kinds import one_key  # noqa: E402
from seedledger.engine.runtime.hooks import Hooks  # noqa: E402
from seedledger.engine.runtime.models.resolve import resolve_model  # noqa: E402
from seedledger.trainers.rewards.verifier import numbers_used, safe_eval  # noqa: E402
from seedledger.trainers.tasks import countdown  # noqa: E402

SIGMA, ALPHA, FIRST_SEED = 0.001, 0.0005, 33
REF_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind and "
    "then provide the user with the answer.Using the numbers [{nums}], create an equation that "
    "equals {target}. You can use basic arithmetic operations (+, -, *, /) and each number can "
    "only be used once. Show your work in <think> </think> tags. And return the final answer in "
    "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.Let me solve this step "
    "by step.\n<think>"
)
PATHS = {
    "default": {},  # seedledger's defaults: backend auto (vLLM where installed), full-rank noise
    "full": {"backend": "hf", "perturbation": "full"},
    "lowrank": {"backend": "hf", "perturbation": "lowrank"},
    "vllm": {"backend": "vllm", "perturbation": "lowrank"},
    "vllm-full": {"backend": "vllm", "perturbation": "full"},
}


def ref_reward(text: str, nums: list[int], target: int) -> float:
    """The reference's `0.1·format + answer` on one decoded sequence (see module docstring)."""
    response = text.split("assistant:")[-1].strip() if "assistant:" in text else text
    full = "<think>" + response
    if re.match(r"^<think>.*?</think>\n<answer>.*?</answer>$", full, re.DOTALL):
        fmt = 1.0
    else:
        fmt = 0.1 * bool(re.search(r"<think>.*?</think>", full, re.DOTALL))
        fmt += 0.5 * bool(re.search(r"<answer>.*?</answer>", full, re.DOTALL))
    answers = re.findall(r"<answer>(.*?)</answer>", response, re.DOTALL)
    answer = 0.0
    if answers and re.match(r"^[0-9+\-*/() ]+$", answers[-1]) and sorted(numbers_used(answers[-1])) == sorted(nums):
        value = safe_eval(answers[-1])
        answer = float(value is not None and abs(float(value) - target) < 1e-5)
    return 0.1 * fmt + answer


class Reference:
    """The paper's loop on one HF model (its `process_seed` and update, in our words)."""

    def __init__(self, model_dir: Path, rows: list[dict], members: int, new_tokens: int):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.initial = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.rows, self.members, self.new_tokens = rows, members, new_tokens
        self.texts = [REF_PROMPT.format(nums=" ".join(map(str, r["nums"])), target=r["target"]) for r in rows]
        self.reset()

    def reset(self) -> None:
        self.model.load_state_dict(self.initial)
        self.rng = np.random.RandomState(FIRST_SEED)

    def _noise(self, param: torch.Tensor, seed: int) -> torch.Tensor:
        gen = torch.Generator(device=param.device)
        gen.manual_seed(int(seed))
        return torch.randn(param.shape, generator=gen, device=param.device, dtype=param.dtype)

    @torch.inference_mode()
    def _score(self) -> float:
        enc = self.tok(self.texts, return_tensors="pt", padding=True, padding_side="left")
        out = self.model.generate(**enc, max_new_tokens=self.new_tokens, do_sample=False,
                                  pad_token_id=self.tok.pad_token_id or self.tok.eos_token_id)
        texts = [self.tok.decode(o, skip_special_tokens=True) for o in out]
        return sum(ref_reward(t, r["nums"], r["target"]) for t, r in zip(texts, self.rows, strict=True)) / len(texts)

    @torch.inference_mode()
    def generation(self) -> tuple[float, float]:
        """One generation; (seconds, mean member reward)."""
        started = time.perf_counter()
        seeds = self.rng.randint(0, 2**30, size=self.members, dtype=np.int64).tolist()
        rewards = []
        for seed in seeds:
            for p in self.model.parameters():
                p.add_(SIGMA * self._noise(p, seed))
            rewards.append(self._score())
            for p in self.model.parameters():
                p.add_(-SIGMA * self._noise(p, seed))
        r = np.array(rewards, dtype=np.float32)
        z = (r - r.mean()) / (r.std() + 1e-8)
        for p in self.model.parameters():
            update = torch.zeros_like(p)
            for seed, zi in zip(seeds, z, strict=True):
                update.add_(self._noise(p, seed).mul_(float(zi)))
            p.add_(ALPHA * update.div_(self.members))
        return time.perf_counter() - started, float(r.mean())


def task_files(rows: list[dict], where: Path) -> dict:
    """Seedledger's countdown task on exactly these problems (train = all of them)."""
    train, test = where / "train.jsonl", where / "test.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    test.write_text(json.dumps(rows[0]) + "\n")
    return {"name": "countdown", "path": str(train), "test_path": str(test)}


def run_path(name: str, args, task: dict, ref: Reference, where: Path) -> dict:
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    ref.reset()

    def end(record, seconds: float) -> None:
        mean = record.reward_stats()["mean"]
        ours.append((seconds, float("nan") if mean is None else mean))
        theirs.append(ref.generation())
        t = record.timings  # where ours went: members' weights, their decoding, the update
        parts = ", ".join(f"{k} {t[k]:.1f}s" for k in ("load_member", "evaluate", "update") if k in t)
        print(f"  {name} gen {len(ours)}: ours {ours[-1][0]:7.1f}s r={ours[-1][1]:.3f} ({parts}) | "
              f"reference {theirs[-1][0]:7.1f}s r={theirs[-1][1]:.3f}", flush=True)

    cfg = {"model": args.model, "task": task, "population": args.members, "sigma": SIGMA, "lr": ALPHA,
           "batch_size": len(ref.rows), "max_new_tokens": args.new_tokens, "generations": args.generations,
           **PATHS[name]}
    done = api.train(cfg, run=name, ledger=where / f"{name}.db", hooks=Hooks(on_generation_end=end))
    backend, kind = done.run.config["backend"], one_key(done.run.config)["train"]
    steady = slice(1, None) if len(ours) > 1 else slice(None)
    o = statistics.median(s for s, _ in ours[steady])
    t = statistics.median(s for s, _ in theirs[steady])
    return {"path": name, "backend": backend, "perturbation": kind if isinstance(kind, str) else "lowrank",
            "ours_s": o, "reference_s": t, "speedup": t / o,
            "ours_rewards": [r for _, r in ours], "reference_rewards": [r for _, r in theirs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paths", nargs="+", choices=list(PATHS), default=["full", "lowrank", "vllm"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = countdown.generate(data_seed=0, level=countdown.DEFAULT_LEVEL, count=args.prompts, role=1)
    model_dir = resolve_model(args.model)
    ref = Reference(model_dir, rows, args.members, args.new_tokens)
    print(f"model {args.model}, N={args.members}, {args.prompts} prompts, {args.new_tokens} new tokens, "
          f"greedy, fp32, {args.threads} threads, {args.generations} generations per path")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.paths:
            if name.startswith("vllm") and not _has_vllm():
                print("  vllm: not installed, skipped")
                continue
            results.append(run_path(name, args, task_files(rows, Path(tmp)), ref, Path(tmp)))
    print("\npath       backend  noise    ours s/gen  reference s/gen  speed-up (same run)")
    for r in results:
        print(f"{r['path']:10} {r['backend']:8} {r['perturbation']:8} {r['ours_s']:10.1f} "
              f"{r['reference_s']:16.1f} {r['speedup']:10.2f}x")
    print(json.dumps(results))


def _has_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
