"""What choosing_bench.py, grpo_bench.py and sft_bench.py share, so every method is judged
alike: one task (a seedledger config's rows, split and prompts), one decoding function
(HF `generate`, greedy, chat template, left padding), one held-out verdict (the task's own
answer check: exact match for the words configs), one wall-clock budget and one report
(base → final on the same rows, paired gain ± s.e., better/worse counts, steps per minute,
peak RSS). Each method runs in a process of its own (`run_isolated`), so the peak RSS that
`os.wait4` reports for it is that method's alone.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "reward": ROOT / "engine" / "configs" / "reward.yaml",  # reward-only: arithmetic's `number` verifier
    "words": ROOT / "engine" / "configs" / "words_contains.yaml",  # reward-only: `contains` on the word task
    "demo": ROOT / "engine" / "configs" / "demo.yaml",  # likelihood of the reference (`loglik`)
    "arithmetic": ROOT / "configs" / "arithmetic.yaml",
}


def quiet_hf() -> None:
    """Offline, no progress bars, and TRL kept from importing vLLM, which none of these
    methods uses on a CPU (generation goes through HF): its import alone costs seconds and
    hundreds of MB that would count in a method's peak RSS."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.modules.setdefault("vllm", None)  # importlib.util.find_spec("vllm") is None from here on


def config_path(name: str) -> Path:
    """A `--config` value: a name of CONFIGS or a path."""
    return CONFIGS.get(name, Path(name))


def bench_task(config: str, overrides: list[str] = ()) -> tuple[Any, Any]:
    """(validated config, Task) of `config`: the rows, split and prompts seedledger trains on."""
    from seedledger.engine.config import load_config
    from seedledger.trainers.tasks import load_task

    path = config_path(config)
    cfg = load_config(path, list(overrides))
    return cfg, load_task(cfg.task, seed=cfg.seed, base_dir=path.parent)


def training_rows(task: Any, cfg: Any, steps: int) -> list[list[dict]]:
    """The rows of seedledger's generations 1..steps, in its order (`Task.train_batch`)."""
    return [task.train_batch(cfg.seed, g, cfg.batch_size)[1] for g in range(1, steps + 1)]


def complete(model: Any, tok: Any, task: Any, rows: list[dict], new_tokens: int, batch: int = 25) -> list[str]:
    """Greedy completions of `rows` (the task's chat prompt, left padding, fp32 as loaded)."""
    import torch

    if tok.pad_token is None:  # a GGUF-converted tokenizer may name none
        tok.pad_token = tok.eos_token
    done: list[str] = []
    with torch.inference_mode():
        for i in range(0, len(rows), batch):
            part = rows[i:i + batch]
            texts = [tok.apply_chat_template(task.prompt(r), add_generation_prompt=True, tokenize=False)
                     for r in part]
            enc = tok(texts, return_tensors="pt", padding=True, padding_side="left",
                      add_special_tokens=False).to(model.device)
            out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id or tok.eos_token_id)
            done += [tok.decode(o[enc["input_ids"].shape[1]:], skip_special_tokens=True) for o in out]
    return done


@dataclass(frozen=True)
class Judged:
    """Held-out greedy answers judged twice, per row: `verdicts` by the task's own answer
    check (exact match), `rewards` by the config's decoded fitness (the training reward on
    rows never trained on: a finer figure where exact match stays at 0 for every method)."""

    verdicts: list[float]
    rewards: list[float]

    @property
    def mean(self) -> float:
        return sum(self.verdicts) / len(self.verdicts)


def judge(task: Any, rows: list[dict], completions: list[str]) -> Judged:
    """`completions` of `rows` judged by the task's own answer check (its `own_rewards`,
    whatever the config trains on) and by the config's decoded rewards (`held_out_reward`)."""
    from seedledger.trainers.rewards.combine import combine
    from seedledger.trainers.tasks.base import as_conversation, columns_of

    prompts = [task.prompt(r) for r in rows]
    convo = [as_conversation(c) for c in completions]
    total, _ = combine(task.own_rewards, prompts, convo, columns_of(rows))
    fitness, _ = task.held_out_reward(prompts, completions, rows)
    return Judged([float(t) for t in total], [float(f) for f in fitness])


def base_model(cfg: Any) -> tuple[Any, Any]:
    """The config's base model and tokenizer, fp32 on the CPU, from seedledger's model cache."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seedledger.engine.runtime.models.resolve import resolve_model

    model_dir = resolve_model(cfg.model)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def common_arguments(ap: Any, config: str) -> None:
    """The options every TRL method's script shares with choosing_bench.py's command line."""
    ap.add_argument("--config", default=config, help=f"demo, reward, arithmetic or a config path (default: {config})")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--seconds", type=float, required=True, help="training wall time")
    ap.add_argument("--steps", type=int, help="stop after this many steps too (equal steps, not seconds)")
    ap.add_argument("--rows", type=int, help="held-out rows (default: the config's evaluation.rows)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--result", type=Path, help="write the report here (JSON)")


def prepared(args: Any) -> tuple[Any, Any, list[dict], Any, Any, Judged]:
    """The run's config, task, held-out rows, base model and tokenizer (a pad token named),
    and the base's held-out judgement, printed."""
    import torch

    torch.set_num_threads(args.threads)
    cfg, task = bench_task(args.config, args.overrides)
    test = task.test_rows()[: args.rows or cfg.evaluation.rows or len(task.test_rows())]
    model, tok = base_model(cfg)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    base = judge(task, test, complete(model, tok, task, test, cfg.max_new_tokens))
    print(f"base: held-out {base.mean:.3f} on {len(test)} rows", flush=True)
    return cfg, task, test, model, tok, base


class Budget:
    """Wall-clock budget of a training loop: started at its first step's start; a loop
    reports each finished step (`step_done`) and stops once it says the budget is spent
    (the step in flight finishes), or after `steps` steps where given: the same number of
    steps on a loaded machine, where seconds say little. `spent` is the training time up to
    the last step's end, evaluation and saving after it left out."""

    def __init__(self, seconds: float, steps: int | None = None):
        self.seconds = seconds
        self.max_steps = steps
        self.started: float | None = None
        self.ended: float | None = None
        self.steps = 0

    def start(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def step_done(self) -> bool:
        """Count a finished step; True when the budget is spent."""
        self.steps += 1
        self.ended = time.perf_counter()
        return self.elapsed() >= self.seconds or (self.max_steps is not None and self.steps >= self.max_steps)

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.perf_counter() - self.started

    @property
    def spent(self) -> float:
        return 0.0 if self.started is None or self.ended is None else self.ended - self.started


def peak_rss_mib() -> float:
    """This process's peak resident set so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def report(method: str, base: Judged, final: Judged, budget: Budget, step: str, **extra: Any) -> dict[str, Any]:
    """One method's figures (JSON-able); `step` says what one step is."""
    from seedledger.engine.runtime.scoring.heldout import paired_change

    change = paired_change(base.verdicts, final.verdicts)
    reward = paired_change(base.rewards, final.rewards)
    minutes = budget.spent / 60
    return {"method": method, "rows": len(base.verdicts), "base": base.mean, "final": final.mean,
            "gain": change["mean"], "gain_se": change["stderr"], "better": change["better"],
            "worse": change["worse"], "base_reward": sum(base.rewards) / len(base.rewards),
            "final_reward": sum(final.rewards) / len(final.rewards), "reward_gain": reward["mean"],
            "reward_gain_se": reward["stderr"], "steps": budget.steps, "step": step,
            "train_seconds": round(budget.spent, 1),
            "steps_per_minute": round(budget.steps / minutes, 3) if minutes else 0.0,
            "peak_rss_mib": round(peak_rss_mib()), **extra, "base_rows": base.verdicts,
            "final_rows": final.verdicts, "base_reward_rows": base.rewards, "final_reward_rows": final.rewards}


def line(r: dict[str, Any]) -> str:
    """One report as the table row every script prints."""
    return (f"{r['method']:<14} {r['base']:.3f} → {r['final']:.3f}  {r['gain']:+.3f} ± {r['gain_se']:.3f}"
            f"  {r['better']:>3}/{r['worse']:<3} {r['base_reward']:.4f} → {r['final_reward']:.4f}"
            f"  {r['reward_gain']:+.4f} ± {r['reward_gain_se']:.4f} {r['steps_per_minute']:>8.2f}"
            f"  {r['peak_rss_mib']:>7,.0f}  {r['steps']} × {r['step']} in {r['train_seconds']:.0f} s")


HEADER = (f"{'method':<14} {'base → final':<13}  {'gain ± s.e.':<14}  {'b/w':<7} {'reward base → final':<17}"
          f"  {'reward gain ± s.e.':<18} {'steps/min':>8}  {'RSS MiB':>7}  steps")


def finish(r: dict[str, Any], result: Path | None) -> None:
    """Print the report and write it to `result` (JSON) for the driver."""
    print(HEADER)
    print(line(r), flush=True)
    if result is not None:
        result.write_text(json.dumps(r))


def run_isolated(cmd: list[str], result: Path) -> dict[str, Any]:
    """Run one method's command in its own process (output passed through); its report
    from `result`, with `peak_rss_mib` replaced by the kernel's figure for that process
    tree (`os.wait4`: the child and the descendants it waited for)."""
    proc = subprocess.Popen(cmd, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    code = proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {code}")
    r = json.loads(result.read_text())
    r["peak_rss_mib"] = round(usage.ru_maxrss / 1024)
    return r
