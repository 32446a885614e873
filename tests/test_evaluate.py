"""`seedledger evaluate`, `sl.evaluate` and `evaluation.every` on the `tiny` model: the figures
against an independent scoring of the rebuilt model and against hand computation, the
`evaluation` events, and bad input as one line."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

import seedledger as sl
from seedledger.engine.config import validate
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from tests.support.configs import TINY
from tests.support.runs import cli

ROWS = 6
# a length limit the random model's answers straddle: per-row rewards differ, so the paired
# figures are not all zero
CONFIG = {**TINY, "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 20}]},
          "generations": 3, "lr": 0.05, "sigma": 0.05, "evaluation": {"rows": ROWS, "every": 2}}
EVIL = """\
from pathlib import Path
Path(__file__).with_name("pwned").write_text("imported")


def f(prompts, completions, **columns):
    return [0.0] * len(completions)
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """One ledger: `ev` (3 generations, scored every 2 during training) and `plain` (the
    same config without `every`)."""
    work = tmp_path_factory.mktemp("evaluate")
    db = work / "l.db"
    sl.train(CONFIG, run="ev", ledger=db)
    sl.train({**CONFIG, "evaluation": {"rows": ROWS}}, run="plain", ledger=db)
    return work


def _independent(model_dir: Path, cfg, rows: list[dict]) -> tuple[list[str], list[float | None]]:
    """Greedy answers of the model in `model_dir` through plain transformers, one row at a
    time (no padding), scored by the task's own scorer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seedledger.trainers.tasks import load_task

    task = load_task(cfg.task, seed=cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts, completions = [], []
    for row in rows:
        prompt = task.prompt(row)
        text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=cfg.max_new_tokens, pad_token_id=tok.eos_token_id)
        prompts.append(prompt)
        completions.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    rewards, _ = task.reward(prompts, completions, rows)
    return completions, rewards


@pytest.mark.slow
def test_evaluate_equals_an_independent_scoring_of_the_rebuilt_model(work: Path, tiny_model_dir: Path) -> None:
    from seedledger.trainers.tasks import load_task

    db = work / "l.db"
    cfg = validate(CONFIG)
    result = sl.evaluate("ev@3", rows=4, skip=1, ledger=db, record=False)
    rows = load_task(cfg.task, seed=cfg.seed).test_rows()[1:5]
    sl.rebuild_to("ev@3", work / "ev3", ledger=db)
    completions, rewards = _independent(work / "ev3", cfg, rows)
    assert result.completions == completions and result.rewards == rewards
    assert [s["completion"] for s in result.samples] == [completions[s["row"] - 1] for s in result.samples]
    base_completions, base_rewards = _independent(tiny_model_dir, cfg, rows)
    assert result.against == "ev@0" and result.against_rewards == base_rewards
    assert result.against_completions == base_completions != completions  # the weights moved
    assert [s["against_completion"] for s in result.samples] == [base_completions[s["row"] - 1]
                                                                 for s in result.samples]


def _by_hand(before: list[float], after: list[float]) -> dict:
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    stderr = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) / math.sqrt(n)
    return {"mean": mean, "stderr": stderr, "better": sum(d > 0 for d in diffs), "worse": sum(d < 0 for d in diffs)}


@pytest.mark.parametrize("against", ["base", "plain@1"])
def test_paired_figures_by_hand(work: Path, against: str) -> None:
    db = work / "l.db"
    result = sl.evaluate("ev@3", against=against, ledger=db, record=False)
    other = sl.evaluate("plain@1" if against != "base" else "ev@0", against="base", ledger=db, record=False)
    assert result.rows == ROWS and None not in result.rewards + result.against_rewards
    assert result.against == ("ev@0" if against == "base" else "plain@1")
    assert result.against_rewards == other.rewards  # the comparison is scored as itself
    assert result.mean == pytest.approx(statistics.fmean(result.rewards))
    assert result.against_mean == pytest.approx(sum(other.rewards) / ROWS)
    hand = _by_hand(result.against_rewards, result.rewards)
    assert hand["better"] + hand["worse"] > 0 and len(set(result.rewards)) > 1  # not vacuous
    assert result.change == {**hand, "mean": pytest.approx(hand["mean"]), "stderr": pytest.approx(hand["stderr"])}
    assert set(result.components) == set(result.against_components) == {"arithmetic", "length"}


def test_evaluate_records_an_event_and_json_shape(work: Path) -> None:
    db = work / "l.db"
    proc = cli("evaluate", "ev@2", "--rows", "3", "--skip", "2", "--json", "--ledger", db)
    doc = json.loads(proc.stdout)
    assert {"run", "generation", "against", "rows", "skip", "mean", "against_mean", "components",
            "against_components", "change", "rewards", "against_rewards", "samples"} <= set(doc)
    assert (doc["run"], doc["generation"], doc["against"], doc["rows"], doc["skip"]) == ("ev", 2, "ev@0", 3, 2)
    assert len(doc["rewards"]) == 3 and set(doc["change"]) == {"mean", "stderr", "better", "worse"}
    assert all(2 <= s["row"] <= 4 for s in doc["samples"]) and 1 <= len(doc["samples"]) <= 3
    assert "scoring ev@2" in proc.stderr  # progress on stderr, stdout is the JSON alone
    with Ledger.open(str(db)) as led:
        event = led.events("ev", "evaluation")[-1].payload
    assert event["by"] == "evaluate" and event["generation"] == 2 and event["skip"] == 2
    assert event["mean"] == doc["mean"] and event["change"] == doc["change"]
    assert event["against"] == "ev@0" and event["components"] == doc["components"]

    human = cli("evaluate", "ev", "--rows", "2", "--ledger", db).stdout
    assert "ev@3" in human and "change on the same rows" in human and "mean reward" in human
    shown = cli("show", "ev", "--json", "--ledger", db)
    assert [e["by"] for e in json.loads(shown.stdout)["evaluations"]][-2:] == ["evaluate", "evaluate"]


def test_every_scores_at_the_right_generations_and_leaves_fingerprints_alone(work: Path) -> None:
    db = work / "l.db"
    with Ledger.open(str(db)) as led:
        during = [e.payload for e in led.events("ev", "evaluation") if e.payload["by"] == "training"]
        assert [p["generation"] for p in during] == [2, 3]  # every 2, and the session's end
        assert not led.events("plain", "evaluation")
        prints = [[led.generation(r, g).fingerprint for g in (1, 2, 3)] for r in ("ev", "plain")]
    assert prints[0] == prints[1]
    fresh = sl.evaluate("ev@2", ledger=db, record=False)
    assert during[0]["mean"] == fresh.mean and during[0]["change"] == fresh.change
    log = json.loads(cli("log", "ev", "--json", "--ledger", db).stdout)
    assert [g["held_out"] is not None for g in log["generations"]] == [False, True, True]
    from seedledger.engine.cli.plot import plot_runs

    with Ledger.open(str(db)) as led:  # the stars: the base (the events' comparison), 2 and 3
        stars = plot_runs(led, ["ev"], work / "ev.png")["runs"][0]["held_out"]
    assert {(0, during[0]["against_mean"]), (2, during[0]["mean"]), (3, during[1]["mean"])} <= {
        (s["generation"], s["reward"]) for s in stars}


def test_bad_input_is_one_line(work: Path) -> None:
    db = work / "l.db"
    for args, needle in [
        (["nope"], "nope"),
        (["ev@9"], "latest generation is ev@3"),
        (["ev", "--rows", str(10**6)], "beyond the task's"),
        (["ev", "--against", "nope@1"], "nope"),
    ]:
        proc = cli("evaluate", *args, "--ledger", db, check=False)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    proc = cli("evaluate", "ev", "--ledger", work / "typo.db", check=False)
    assert proc.returncode == 2 and "typo.db" in proc.stderr and not (work / "typo.db").exists()
    with pytest.raises(SeedLedgerError, match="--rows must be at least 1"):
        sl.evaluate("ev", rows=0, ledger=db)
    sl.train({**CONFIG, "task": "countdown"}, run="other", generations=0, ledger=db)
    with pytest.raises(SeedLedgerError, match="same model, trained parameters and task"):
        sl.evaluate("ev", against="other@0", ledger=db)


def test_reward_code_named_by_the_ledger_needs_trust_code(tmp_path: Path) -> None:
    (tmp_path / "evil.py").write_text(EVIL)
    config = {**CONFIG, "generations": 1, "evaluation": {"rows": 2},
              "task": {"name": "arithmetic", "rewards": ["task", {"fn": f"{tmp_path / 'evil.py'}:f"}]}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    db = tmp_path / "l.db"
    sl.train(tmp_path / "c.yaml", run="r", ledger=db)  # the user's own config: it runs
    (tmp_path / "pwned").unlink()
    proc = cli("evaluate", "r", "--ledger", db, check=False)
    assert proc.returncode == 2 and "--trust-code" in proc.stderr and "evil.py" in proc.stderr
    assert not (tmp_path / "pwned").exists()
    assert json.loads(cli("evaluate", "r", "--trust-code", "--json", "--ledger", db).stdout)["rows"] == 2
    assert (tmp_path / "pwned").exists()
