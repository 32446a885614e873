"""`loglik` fitness (issue 30 item 2): a row's reference answer scored by teacher forcing.

The batched scores (every low-rank member's rows in one forward, and full-rank members
loaded in turn) equal an independent computation: plain transformers on a copy of the
model whose weights are the member's materialised W + sign·σ·A·Bᵀ/√r, one unpadded row
at a time. A loglik run decodes nothing, resumes and rebuilds from its seed file to the
same fingerprint, and its held-out figures are decoded verdicts.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_cli_walkthrough import Cli

from seedledger.engine.config import validate
from seedledger.engine.runtime.backends.base import Population
from seedledger.engine.runtime.scoring.evaluator import Evaluator
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay import perturbation
from seedledger.trainers.es import ES
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.policy_base import State
from seedledger.trainers.rewards.loglik import LikelihoodReward
from seedledger.trainers.shaping import differences, shape
from seedledger.trainers.tasks import load_task

BASE = {"model": "tiny", "task": {"name": "arithmetic", "rewards": ["loglik"]}, "population": 4,
        "batch_size": 5, "seed": 3, "sigma": 0.0625, "lr": 0.01}


def _independent(model, tok, prompt, reference: str) -> float:
    """Mean log-probability of reference + end-of-turn under `model`, one row, no padding."""
    text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    context = tok(text, add_special_tokens=False)["input_ids"]
    eos = model.generation_config.eos_token_id or tok.eos_token_id
    target = tok(reference, add_special_tokens=False)["input_ids"] + [eos[0] if isinstance(eos, list) else eos]
    ids = torch.tensor([context + target])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
    picked = [logp[len(context) - 1 + t, tok_id].item() for t, tok_id in enumerate(target)]
    return sum(picked) / len(picked)


@pytest.mark.parametrize("kind", ["lowrank", "full"])
def test_loglik_equals_each_member_scored_alone_on_materialised_weights(kind, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = validate({**BASE, "perturbation": kind})
    ev = Evaluator(cfg, tiny_model_dir)
    _, rows = ev.task.train_batch(cfg.seed, 1, cfg.batch_size)
    prompts = [ev.task.prompt(r) for r in rows]
    refs = ev.task.likelihood_rewards[0].references(rows)
    members, _ = ES(cfg.population).ask(State(), run_key=99, generation=1, sigma=0.0625)
    population = Population(tuple(m.key for m in members), tuple(m.sign for m in members),
                            0.0625, (None,) * len(members))
    batched = ev.backend.loglik(ev.master, population, prompts, refs).scores

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    spec = cfg.perturbation_spec()
    deltas = []
    for m, member in enumerate(members):
        with torch.no_grad():
            for name, param in model.named_parameters():
                w = base[name].clone()
                if kind == "lowrank" and spec.trained(name, tuple(w.shape)):
                    a, b = perturbation.factors(member.key, name, tuple(w.shape), spec.rank)
                    w += member.sign * 0.0625 * spec.inv_sqrt_rank * (a @ b.T)
                elif kind == "full":
                    ev.backend.load_member(ev.master, member.key, member.sign, 0.0625)  # replay's own ε
                    w = dict(ev.backend.model.named_parameters())[name].detach().clone()
                param.copy_(w)
        for j, (prompt, ref) in enumerate(zip(prompts, refs, strict=True)):
            deltas.append(abs(batched[m][j] - _independent(model, tok, prompt, ref)))
    worst = max(deltas)
    within = sum(d <= 1e-4 for d in deltas) / len(deltas)
    print(f"{kind}: max |Δ| = {worst:.2e} over {len(deltas)} rows, {within:.0%} within 1e-4")
    assert within >= 0.99 and worst < 1e-3
    # members differ: the fitness is dense (no ties)
    assert len({round(sum(s), 9) for s in batched}) == len(members)


def test_reference_and_options():
    r = LikelihoodReward("loglik", 1.0, "Answer: {answer}.", "gold")
    assert r.reference({"gold": 42}) == "Answer: 42."
    with pytest.raises(SeedLedgerError, match="no text in column 'gold'"):
        r.reference({"answer": "x"})
    task = load_task({"name": "arithmetic", "rewards": [{"fn": "loglik", "template": "{answer}"}, "format"]})
    assert task.decodes and [x.name for x in task.likelihood_rewards] == ["loglik"]
    only = load_task({"name": "arithmetic", "rewards": ["loglik"]})
    assert not only.decodes
    # held-out rows are decoded verdicts: the task's own answer check scores them
    rows = only.test_rows()[:2]
    prompts = [only.prompt(r) for r in rows]
    answers = [f"<answer>{r['answer']}</answer>" for r in rows]
    rewards, components = only.held_out_reward(prompts, answers, rows)
    assert rewards == [1.0, 1.0] and "loglik" not in components


@pytest.mark.parametrize("overrides, message", [
    ({"passk": {"n": 4, "k": 2}, "sampling": {"temperature": 1.0}}, "passk needs sampled ones"),
    ({"kl": {"beta": 0.1}}, "with only loglik rewards none are decoded"),
    ({"task": {"name": "arithmetic", "rewards": [{"fn": "loglik", "colour": 1}]}}, "unknown option 'colour'"),
])
def test_conflicting_settings_are_refused_when_the_config_loads(overrides, message):
    with pytest.raises(SeedLedgerError, match=message):
        validate({**BASE, **overrides})


def test_difference_shaping_is_the_projected_gradient():
    assert differences([1.0, 3.0], 0.5) == [-2.0, 2.0]
    with pytest.raises(TypeError, match="sigma"):  # σ is an argument: no call can forget it
        shape("difference", [0.0, 1.0, 2.0, 3.0])
    rewards = [0.0, 1.0, 2.0, 3.0]
    assert shape("difference", rewards, 0.5) == differences(rewards, 0.5) == [-3.0, -1.0, 1.0, 3.0]
    es = ES(4, mirrored=False, shaping="difference")  # tell divides by the σ it is given
    members, state = es.ask(State(), 1, 1, sigma=0.5)
    told = es.tell(state, members, rewards, lr=1.0, sigma=0.5, optimizer=OptimizerSpec())
    assert told.coefficients == [-0.75, -0.25, 0.25, 0.75]


@pytest.mark.slow
def test_a_loglik_run_killed_resumes_forks_and_rebuilds_exactly(tmp_path):
    """3 generations straight == SIGKILLed inside generation 3's update, then resumed; a fork
    of it rebuilds from its own seed file to its fingerprint."""
    cli = Cli(tmp_path)
    cfg = tmp_path / "ll.yaml"
    cfg.write_text(json.dumps({**BASE, "perturbation": "lowrank", "shaping": "difference", "lr": 0.002}))
    cli.run("train", str(cfg), "--run", "a", "--generations", "3")
    plain = cli.env
    cli.env = {**plain, "SEEDLEDGER_FAILPOINT": "update@3"}
    cli.run("train", str(cfg), "--run", "b", "--generations", "3", code=-9)
    cli.env = plain
    cli.run("resume", "b", "--generations", "1")
    a, b = (cli.json("show", run) for run in ("a", "b"))
    assert a["fingerprint"] == b["fingerprint"]
    cli.run("fork", "a@2", "--run", "c", "--set", "shaping=zscore", "--generations", "2")
    c = cli.json("show", "c")
    cli.run("export", "c", "-o", "c.seeds")
    assert cli.json("rebuild", "c.seeds", "-o", "out")["fingerprint"] == c["fingerprint"] != a["fingerprint"]
