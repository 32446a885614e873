"""ESSA on SmolLM2: CMA-ES over an SFT adapter's singular values, against LoRA-ES from the same adapter.

ESSA (arXiv 2507.04453) first fine-tunes a LoRA adapter with SFT, then aligns it with
CMA-ES over the singular values of each B·A only (`train.essa`). This script does both
steps on this CPU and compares with LoRA-ES on every adapter entry from the same start:

1. SFT: a PEFT LoRA (r 8, alpha 16, the seven projections) trained with AdamW on the
   arithmetic task's training rows (the chat prompt, then the tagged answer; loss on the
   answer tokens only), `--sft-steps` steps of `--sft-batch` rows: a short SFT, so that
   ES has room left to climb.
2. From that adapter, `--generations` generations of each kind, with the demo's
   population (8, mirrored), batch (16) and tokens (24):
   - `essa`: `train.essa: true`, `algorithm: cmaes`, over d = r·modules numbers;
     σ = `--essa-sigma` × the RMS of the adapter's singular values;
   - `lora`: LoRA-ES, `algorithm: es` on all r·(in + out) entries per module (σ 1e-2,
     lr 5e-3: `lora_bench.py learn`'s settings).
3. Each kind's generation 0 (the SFT adapter; ESSA's is its singular form, equal up to
   fp32 rounding) and final master score the same test rows; gains carry paired
   standard errors.

    python benchmarks/essa_bench.py [--workdir essa-bench-out] [--sft-steps 40] [--generations 8] [--rows 200]

Prints one JSON line per step and a summary.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "smollm2-135m-instruct"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def sft(model_dir: Path, out: Path, steps: int, batch: int, lr: float, seed: int) -> dict:
    """Train and save the SFT adapter (a PEFT directory); returns its loss curve's ends."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seedledger.trainers.tasks.registry import load_task

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, lora_dropout=0.0,
                                             bias="none", task_type="CAUSAL_LM"))
    task = load_task("arithmetic", seed=seed)
    rows = task.train_rows()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    model.train()
    for step in range(steps):
        ids, labels = [], []
        for row in rows[step * batch:(step + 1) * batch]:
            messages = task.prompt(row)
            prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            full = tok.apply_chat_template(
                messages + [{"role": "assistant", "content": f"<answer>{row['answer']}</answer>"}], tokenize=True)
            if hasattr(prompt, "input_ids"):  # transformers may hand back a BatchEncoding
                prompt, full = prompt["input_ids"], full["input_ids"]
            ids.append(full)
            labels.append([-100] * len(prompt) + full[len(prompt):])
        width = max(map(len, ids))
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
        attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
        target = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
        loss = model(input_ids=input_ids, attention_mask=attention, labels=target).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    model.save_pretrained(out)
    return {"sft_steps": steps, "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4)}


def singular_rms(adapter_dir: Path) -> float:
    from seedledger.engine.runtime.models.adapters import read_peft_dir
    from seedledger.replay.adapter import PREFIX, singular_form

    _, tensors = read_peft_dir(adapter_dir)
    modules = [n[len(PREFIX):-len(".lora_A.weight")] for n in tensors if n.endswith(".lora_A.weight")]
    master = singular_form(tensors, modules)
    s = torch.cat([t for n, t in master.items() if n.endswith(".essa.s")])
    return float(s.pow(2).mean().sqrt())


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    d = [x - y for x, y in zip(a, b, strict=True)]
    m = sum(d) / len(d)
    return m, math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1) / len(d))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=Path("essa-bench-out"))
    p.add_argument("--model", default=MODEL)
    p.add_argument("--sft-steps", type=int, default=40)
    p.add_argument("--sft-batch", type=int, default=8)
    p.add_argument("--sft-lr", type=float, default=2e-4)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--rows", type=int, default=200)
    p.add_argument("--essa-sigma", type=float, default=0.05, help="σ as a fraction of the singular values' RMS")
    p.add_argument("--kinds", nargs="*", default=["essa", "lora"])
    args = p.parse_args()

    from seedledger.engine.config import validate
    from seedledger.engine.runtime import session
    from seedledger.engine.runtime.models.resolve import resolve_model
    from seedledger.engine.runtime.scoring.evaluator import Evaluator
    from seedledger.ledger import Ledger
    from seedledger.replay.noise import round_coefficient

    args.workdir.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model(args.model)
    adapter = (args.workdir / "sft").resolve()
    if not (adapter / "adapter_model.safetensors").is_file():
        started = time.perf_counter()
        info = sft(model_dir, adapter, args.sft_steps, args.sft_batch, args.sft_lr, seed=0)
        print(json.dumps(info | {"sft_seconds": round(time.perf_counter() - started)}), flush=True)
    rms = singular_rms(adapter)
    demo = yaml.safe_load((ROOT / "configs" / "arithmetic.yaml").read_text())  # its `train:` is replaced below
    common = demo | {"model": args.model, "generations": args.generations, "anchor_every": 0}
    configs = {
        "essa": common | {"train": {"kind": "lora", "init": str(adapter), "essa": True}, "algorithm": "cmaes",
                          "sigma": round_coefficient(args.essa_sigma * rms)},  # lr: CMA-ES records c_m
        "lora": common | {"train": {"kind": "lora", "init": str(adapter)}, "sigma": 1e-2, "lr": 5e-3},
    }
    scores: dict[str, list[float]] = {}
    summary: dict = {"singular_value_rms": round(rms, 5), "rows": args.rows, "generations": args.generations}
    with Ledger.open(str(args.workdir / "essa.db")) as led:
        for kind in args.kinds:
            path = args.workdir / f"{kind}.yaml"
            path.write_text(yaml.safe_dump(configs[kind]))
            started = time.perf_counter()
            if not led.has_run(kind):
                session.start(led, str(path), kind, [], None)
            elif led.latest_generation(kind) < args.generations:  # an interrupted earlier call
                session.resume(led, kind, None)
            seconds = time.perf_counter() - started
            cfg = validate(led.get_run(kind).config)
            ev = Evaluator(cfg, resolve_model(cfg.model))
            # each kind's own generation 0: the SFT adapter (ESSA's: its singular form, fp32)
            start = [r or 0.0 for r in ev.held_out_rewards(args.rows)]
            ev.restore(led, kind, led.latest_generation(kind), None)
            scores[kind] = [r or 0.0 for r in ev.held_out_rewards(args.rows)]
            del ev  # one model in memory at a time
            gain, se = paired(scores[kind], start)
            line = {"kind": kind, "train_seconds": round(seconds), "sigma": cfg.sigma,
                    "step": "cmaes c_m 1" if cfg.algorithm == "cmaes" else f"lr {cfg.lr}",
                    "start_held_out": round(sum(start) / len(start), 4),
                    "final_held_out": round(sum(scores[kind]) / len(scores[kind]), 4),
                    "gain": round(gain, 4), "gain_se": round(se, 4)}
            print(json.dumps(line), flush=True)
            summary[kind] = line
    if {"essa", "lora"} <= set(scores):
        diff, se = paired(scores["essa"], scores["lora"])
        summary["essa_minus_lora"] = {"value": round(diff, 4), "se": round(se, 4)}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
