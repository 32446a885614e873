"""The command line as a new user meets it (issue 14, items 2-12), through the console
script on the `tiny` model: `--set` one key at a time, `db current` of a missing ledger,
settings refused before a run exists, `rm`, reward options validated with the config,
generations without signal, config errors that name the `--set`, run statuses, the
shipped example configs, output details and `plot`'s refusals. (The README walkthrough
and the custom-reward example run in test_cli_walkthrough.py and here.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from test_cli_walkthrough import README, ROOT, Cli

from tests.support.configs import TINY, tiny_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A ledger with run `r` (2 generations, an anchor after each) and its fork `kid`
    (r@1, 1 generation, an anchor)."""
    work = tmp_path_factory.mktemp("trained")
    (work / "c.yaml").write_text(tiny_config(sigma=0.05, lr=0.01, anchor_every=1))
    cli = Cli(work)
    assert cli.json("train", "c.yaml", "--run", "r")["generations_committed"] == [1, 2]
    assert cli.json("fork", "r@1", "--run", "kid", "--generations", "1")["generations_committed"] == [2]
    return work


@pytest.fixture
def cli(tmp_path, trained) -> Cli:
    """A fresh directory with a copy of the trained ledger, its anchors and config."""
    shutil.copy(trained / "ledger.db", tmp_path / "ledger.db")
    shutil.copytree(trained / "ledger.db.anchors", tmp_path / "ledger.db.anchors")
    shutil.copy(trained / "c.yaml", tmp_path / "c.yaml")
    return Cli(tmp_path)


def _events(ledger: Path, kind: str) -> list[dict]:
    con = sqlite3.connect(ledger)
    try:
        return [json.loads(p) for (p,) in con.execute("SELECT payload FROM events WHERE kind = ?", (kind,))]
    finally:
        con.close()


def _names(cli: Cli) -> list[str]:
    return [r["name"] for r in cli.json("log")]


# -- 2: one --set per key ---------------------------------------------------------------


def test_several_keys_after_one_set_say_one_set_per_key(cli):
    line = cli.bad("train", "c.yaml", "--run", "x", "--set", "generations=200", "population=30")
    assert "one --set per key" in line and "--set population=30" in line
    out = cli.json("train", "c.yaml", "--run", "x", "--set", "generations=0", "--set", "population=2")
    assert out["generations_committed"] == []
    con = sqlite3.connect(cli.workdir / "ledger.db")
    (config,) = con.execute("SELECT config FROM runs WHERE name = 'x'").fetchone()
    con.close()
    assert json.loads(config)["population"] == 2 and json.loads(config)["generations"] == 0
    # the README never shows several keys after one --set again
    assert not re.search(r"--set \S+=\S+ [\w.]+=", README.read_text())


# -- 3: db current of a missing ledger; db history as data --------------------------------


def test_db_current_of_a_missing_ledger_is_an_error_and_history_is_data(cli):
    assert "no ledger at missing.db" in cli.bad("db", "current", "--ledger", "missing.db")
    assert not (cli.workdir / "missing.db").exists()
    history = cli.json("db", "history")
    assert history["revisions"][0] == {"revision": "0001", "title": history["revisions"][0]["title"]}
    assert all(set(r) == {"revision", "title"} and r["title"] for r in history["revisions"])
    current = cli.json("db", "current")
    assert current == {"revision": history["head"], "head": history["head"], "up_to_date": True}


# -- 4: settings that cannot work are refused before the run exists; rm --------------------


def test_impossible_settings_are_refused_before_the_run_exists(cli):
    import torch

    if not torch.cuda.is_available():
        line = cli.bad("train", "c.yaml", "--run", "gpu", "--set", "device=cuda")
        assert "device" in line and "cuda" in line
    assert "is not a device" in cli.bad("train", "c.yaml", "--run", "gpu", "--set", "device=gpu0")
    line = cli.bad("train", "c.yaml", "--run", "v", "--set", "backend=vllm")  # tiny: head size 16
    assert "backend" in line and ("head size is 16" in line or "not installed" in line)
    assert "backend" in cli.bad("fork", "r@1", "--run", "v", "--set", "backend=vllm")
    assert _names(cli) == ["r", "kid"], "no run was created, so the names stay free"


def test_vllm_cpu_head_sizes_match_the_installed_vllm():
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from seedledger.engine.runtime.setup.preflight import VLLM_CPU_HEAD_SIZES

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == VLLM_CPU_HEAD_SIZES


def test_rm_refuses_forks_and_own_generations_then_deletes_with_its_anchor_files(cli):
    work = cli.workdir
    anchors = work / "ledger.db.anchors"
    before = {p.name for p in anchors.iterdir()}
    assert len(before) == 3  # r@1, r@2, kid@2
    assert "has forks (kid)" in cli.bad("rm", "r")
    assert "1 generation of its own" in cli.bad("rm", "kid")
    assert "no run named 'nope'" in cli.bad("rm", "nope")

    out = cli.json("rm", "kid", "--force")
    assert out["run"] == "kid" and out["generations"] == 1 and out["parent"] == "r@1"
    assert len(out["anchor_files_removed"]) == 1 and len(before - {p.name for p in anchors.iterdir()}) == 1
    (event,) = _events(work / "ledger.db", "run-deleted")
    assert event["run"] == "kid" and event["reason"] == "seedledger rm"
    assert _names(cli) == ["r"]
    cli.json("verify", "r")  # the parent is whole
    assert cli.json("fork", "r@1", "--run", "kid", "--generations", "0")["run"] == "kid"  # the name is free

    # a 0-generation run (the dead run) goes without --force
    cli.json("train", "c.yaml", "--run", "empty", "--generations", "0")
    assert "deleted run empty (0 generations)" in cli.run("rm", "empty").stdout

    # never while a live process writes the run: here, this test's own pid holds its lease
    con = sqlite3.connect(work / "ledger.db")
    with con:
        con.execute(
            "INSERT INTO leases (run_id, token, host, pid, holder, since, heartbeat, expires_at) "
            "SELECT id, 'tok', ?, ?, 'someone', datetime('now'), datetime('now'), "
            "datetime('now', '+1 hour') FROM runs WHERE name = 'kid'",
            (os.uname().nodename, os.getpid()),
        )
    con.close()
    assert "being written by someone" in cli.bad("rm", "kid")
    assert "kid" in _names(cli)


# -- 5: reward options are validated with the config -----------------------------------------


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ({"fn": "length", "limit": "abc"}, "rewards[1] (length): limit: Input should be a valid integer"),
        ({"fn": "length", "limit": 4, "wieght": 2}, "unknown option 'wieght' (did you mean 'weight'?)"),
        ({"fn": "tests/data/user_reward.py:shout", "wieght": 2}, "(did you mean 'weight'?)"),
        ({"fn": "length", "limit": 4, "weight": ".nan"}, "weight must be a finite number"),
        ({"fn": "lenght", "limit": 4}, "unknown reward (did you mean 'length'?)"),
    ],
)
def test_reward_options_are_validated_before_the_run_exists(cli, reward, message):
    task = {"name": "arithmetic", "rewards": ["task", reward]}
    text = yaml.safe_dump({**TINY, "task": task}).replace("'.nan'", ".nan")
    (cli.workdir / "bad.yaml").write_text(text)
    line = cli.bad("train", "bad.yaml", "--run", "bad")
    assert message in line and line.startswith("error: bad.yaml: task: ")
    assert "bad" not in _names(cli)


# -- 6: a generation without signal is said and recorded ---------------------------------------


def test_generations_without_signal_warn_and_leave_events(cli):
    # arithmetic alone: a random model scores 0 everywhere, so no member differs
    proc = cli.run("train", "c.yaml", "--run", "flat", "--set", "task=arithmetic", "--json")
    assert "warning: generation 1: no signal (every member's reward is 0)" in proc.stderr
    assert "2 generations in a row without signal" in proc.stderr
    assert json.loads(proc.stdout)["run"] == "flat", "stdout stays one JSON document"
    proc = cli.run("resume", "flat", "--generations", "1")
    assert "generation 3: no signal" in proc.stderr and "3 generations in a row" in proc.stderr
    events = [e["payload"] for e in cli.json("log", "flat")["events"] if e["kind"] == "no-signal"]
    assert [(e["generation"], e["streak"], e["reward"]) for e in events] == [(1, 1, 0.0), (2, 2, 0.0), (3, 3, 0.0)]
    # runs with signal say nothing of the kind
    assert "no signal" not in cli.run("resume", "r", "--generations", "1").stderr


# -- 8: config errors name the --set, all of them, with suggestions ---------------------------


def test_config_errors_blame_the_set_report_all_and_suggest(cli):
    line = cli.bad("train", "c.yaml", "--set", "population=abc")
    assert line.startswith("error: --set population=abc: population: ") and "c.yaml" not in line
    line = cli.bad("train", "c.yaml", "--set", "populaton=8", "--set", "lr=x", "--set", "optimizer.nme=adam")
    assert line.startswith("error: 3 config errors: ")
    assert "--set populaton=8: populaton: unknown key (did you mean 'population'?)" in line
    assert "--set lr=x: lr: " in line
    assert "--set optimizer.nme=adam: optimizer.nme: unknown key (did you mean 'name'?)" in line
    (cli.workdir / "typo.yaml").write_text("model: tiny\nsigam: 0.01\n")
    assert "typo.yaml: sigam: unknown key (did you mean 'sigma'?)" in cli.bad("train", "typo.yaml")
    assert "--set lr=x: lr" in cli.bad("fork", "r@1", "--run", "k2", "--set", "lr=x")


# -- 9: run statuses -------------------------------------------------------------------------


def test_statuses_are_consistent(cli):
    runs = {r["name"]: r["status"] for r in cli.json("log")}
    assert runs == {"r": "finished", "kid": "finished"}  # kid's --generations 1 reached the target 2
    line = cli.bad("resume", "r")
    assert "at its target generation 2 (finished)" in line and "--generations N" in line
    cli.json("train", "c.yaml", "--run", "part", "--generations", "1")
    assert {r["name"]: r["status"] for r in cli.json("log")}["part"] == "stopped"

    # an imported run stays imported through a resume that trains nothing
    cli.json("export", "r", "-o", "r.seeds")
    cli.json("import", "r.seeds", "--run", "copy")
    assert cli.json("resume", "copy", "--generations", "0")["generations_committed"] == []
    assert {r["name"]: r["status"] for r in cli.json("log")}["copy"] == "imported"
    cli.bad("resume", "copy")  # at its target: said, not a silent exit 0

    # `training` with no live writer (its process was killed) reads `interrupted`
    con = sqlite3.connect(cli.workdir / "ledger.db")
    with con:
        con.execute("UPDATE runs SET status = 'training' WHERE name = 'part'")
    con.close()
    assert {r["name"]: r["status"] for r in cli.json("log")}["part"] == "interrupted"
    (part,) = [root for root in cli.json("log", "--graph") if root["name"] == "part"]
    assert part["status"] == "interrupted"


# -- 10: the example configs ship with the package ---------------------------------------------


def test_example_configs_ship_with_the_package(tmp_path):
    cli = Cli(tmp_path)
    listed = cli.json("example")["examples"]
    assert {e["name"] for e in listed} >= {"quickstart", "demo"} and all(e["summary"] for e in listed)
    text = cli.run("example", "quickstart").stdout
    assert text == (ROOT / "engine" / "configs" / "quickstart.yaml").read_text()
    assert yaml.safe_load(text)["model"] == "tiny"
    assert "did you mean 'quickstart'" in cli.bad("example", "quickstar")
    # that they ship in the wheel: tests/test_layout.py::test_the_wheel_installs_one_package
    from seedledger.engine.config import load_config

    for name in ("quickstart", "demo"):  # every shipped config validates
        (tmp_path / f"{name}.yaml").write_text(cli.run("example", name).stdout)
        load_config(tmp_path / f"{name}.yaml")


# -- 11: output details ----------------------------------------------------------------------


def test_help_and_error_output(cli):
    assert "<bool>" not in cli.run("log", "--help").stdout
    err = cli.run("train", "c.yaml", "--set", "device=gpu0", code=2).stderr
    assert err.startswith("error: ") and err.count("\n") == 1, repr(err)  # no blank line first
    err = cli.run("resume", "r", code=2).stderr
    assert err.startswith("error: ") and err.count("\n") == 1, repr(err)


def test_diff_never_wraps_numbers(cli):
    out = cli.run("diff", "r@2", "kid@2").stdout
    total = next(line for line in out.splitlines() if "total" in line)
    numel = cli.json("diff", "r@2", "kid@2")["total"]["numel"]
    assert f"/{numel:,}" in total, out


def test_gguf_provisioning_keeps_a_pipe_quiet(tmp_path):
    """The default model's first use dequantizes a GGUF file; its progress bar must not
    flood a non-terminal stderr (it wrote hundreds of carriage-return frames)."""
    import importlib.metadata

    from seedledger.engine.runtime.models.resolve import SMOLLM2_PACKAGE

    try:
        importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{SMOLLM2_PACKAGE} is not installed")
    cli = Cli(tmp_path)
    cli.env["SEEDLEDGER_HOME"] = str(tmp_path / "home")
    (tmp_path / "c.yaml").write_text(tiny_config(model="smollm2-135m-instruct", generations=0))
    # a process of its own: tqdm reads TQDM_DISABLE when it is imported, once per process
    proc = cli.run("train", "c.yaml", "--run", "s", "--json", process=True)
    assert "\r" not in proc.stderr and "de-quantizing" not in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.splitlines()) < 10, proc.stderr[-2000:]


# -- 12: plot refuses to draw nothing ----------------------------------------------------------


def test_plot_of_a_run_without_generations_is_an_error(cli):
    cli.json("train", "c.yaml", "--run", "empty", "--generations", "0")
    assert "nothing to plot: empty has no generations" in cli.bad("plot", "empty", "-o", "e.png")
    assert not (cli.workdir / "e.png").exists()
    out = cli.json("plot", "r", "empty", "-o", "two.png")
    assert [r["run"] for r in out["runs"]] == ["r"] and out["skipped"] == ["empty"]
    assert "no run named 'nope'" in cli.bad("plot", "r", "nope", "-o", "x.png")


# -- 7: the documented custom reward example, as printed ---------------------------------------


def test_readme_custom_reward_example_trains(tmp_path):
    text = (ROOT / "docs" / "configuration.md").read_text()  # moved there from the README
    section = text[text.index("## Custom reward functions"):]
    code = section.split("```python\n", 1)[1].split("\n```", 1)[0]
    config = section.split("```yaml\n", 1)[1].split("\n```", 1)[0]
    name = code.splitlines()[0].removeprefix("# ").split(":")[0]
    (tmp_path / name).write_text(code)
    (tmp_path / "c.yaml").write_text(config)
    cli = Cli(tmp_path)
    small = ["--set", "generations=1", "--set", "population=2", "--set", "batch_size=2",
             "--set", "max_new_tokens=4", "--set", "keep_samples=true"]
    cli.json("train", "c.yaml", "--run", "mine", *small)
    member = cli.json("show", "mine@1", "0", "--samples")["members"][0]
    component = f"{name}:short_and_right"  # a file's directories stay out of the ledger key
    assert set(member["components"]) == {"arithmetic", component}
    assert member["components"][component] in (0.0, 0.25, 0.5, 0.75, 1.0)

    # called as the engine calls it: chats in, one number per completion out
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_rewards", tmp_path / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from seedledger.trainers.tasks import load_task

    task = load_task(yaml.safe_load(config)["task"], base_dir=tmp_path)
    row = task.test_rows()[0]
    right = f"{row['answer']}"
    _, comps = task.reward([task.prompt(row)] * 2, [right, "no idea at all, sorry"], [row, row])
    assert comps[component] == [1.0, 0.0]
