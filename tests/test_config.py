"""Config validation: defaults that run, overrides, one-line errors naming the field;
curriculum and pass@k checks; relative paths resolved against the config file."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seedledger.engine.config import load_config
from seedledger.ledger.errors import SeedLedgerError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def test_defaults_validate():
    cfg = load_config(None)
    assert cfg.model == "smollm2-135m-instruct"
    assert cfg.optimizer.name == "sgd" and cfg.mirrored and cfg.population % 2 == 0


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("population: 4\noptimizer:\n  name: momentum\n  beta: 0.8\nschedule:\n  lr: cosine\n")
    cfg = load_config(path, ["optimizer.dampening=0.5", "lr=1e-3", "report_to=[tensorboard]"])
    assert cfg.population == 4
    assert (cfg.optimizer.name, cfg.optimizer.beta, cfg.optimizer.dampening) == ("momentum", 0.8, 0.5)
    assert cfg.schedule.lr.name == "cosine"
    assert cfg.lr == 1e-3 and cfg.report_to == ["tensorboard"]
    assert load_config(None, ["optimizer=adam"]).optimizer.name == "adam"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["populaton=8"], "populaton: unknown key"),
        (["population=3"], "even"),
        (["sigma=-1"], "sigma: Input should be greater than 0"),
        (["optimizer.name=lion"], "optimizer.name"),
        (["backend=tensorrt"], "backend"),
        (["workers.count=0"], "workers.count"),
        (["noequals"], "key=value"),
    ],
)
def test_bad_values_name_the_field(overrides, message):
    with pytest.raises(SeedLedgerError, match=message.replace(".", r"\.")) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)


def test_bad_files(tmp_path):
    with pytest.raises(SeedLedgerError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("population: [1, 2\n")
    with pytest.raises(SeedLedgerError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(SeedLedgerError, match="mapping"):
        load_config(listy)


# -- curriculum and pass@k are checked when the config loads (exit 2), not inside train() --


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["curriculum.lower_below=0.8"], "curriculum: lower_below (0.8) must be below raise_above (0.7)"),
        (["curriculum.raise_above=0.2"], "curriculum: lower_below (0.2) must be below raise_above (0.2)"),
        (["curriculum.raise_above=1.5"], "curriculum.raise_above: Input should be less than or equal to 1"),
        (["curriculum.window=0"], "curriculum.window"),
        (["task=jsonl:tests/data/qa.jsonl", "curriculum={}"], "single difficulty level"),
        (["task=countdown:tests/data/countdown.jsonl", "curriculum={}"], "single difficulty level"),
        (["task={mix: [arithmetic, countdown]}", "curriculum={}"], "task mix has a single difficulty level"),
        (["passk.n=2", "passk.k=3", "sampling.temperature=1"], "passk: k (3) must be at most n (2)"),
        (["passk.n=0", "sampling.temperature=1"], "passk.n"),
        (["passk.n=4"], "passk: needs sampling.temperature > 0"),
    ],
)
def test_curriculum_and_passk_are_validated_at_load(overrides, message):
    with pytest.raises(SeedLedgerError, match=re.escape(message)) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value) and info.value.exit_code == 2


def test_valid_curriculum_and_passk():
    cfg = load_config(None, ["curriculum.window=3", "task=countdown",
                             "passk={n: 4, k: 2}", "sampling.temperature=0.7"])
    assert cfg.curriculum.window == 3 and (cfg.passk.n, cfg.passk.k, cfg.passk.threshold) == (4, 2, None)
    assert load_config(None, ["curriculum={}"]).curriculum.lower_below == 0.2  # arithmetic: 5 levels


def test_cli_refuses_a_bad_curriculum_with_exit_2(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: tiny\ntask: math:data.jsonl\ncurriculum: {window: 2}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "seedledger.engine.cli", "train", str(path), "--ledger", str(tmp_path / "l.db")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "single difficulty level" in proc.stderr and "Traceback" not in proc.stderr


# -- LoRA runs on the vllm backend: taken, except with an int8 base (served as stored) --


def test_vllm_takes_lora_runs():
    cfg = load_config(None, ["backend=vllm", "train=lora"])
    assert cfg.backend == "vllm" and cfg.train.kind == "lora"


def test_vllm_refuses_an_int8_base_in_one_line(tmp_path):
    with pytest.raises(SeedLedgerError, match="base_quantization int8: the vllm backend") as info:
        load_config(None, ["backend=vllm", "train=lora", "base_quantization=int8"])
    assert "\n" not in str(info.value) and info.value.exit_code == 2
    path = tmp_path / "c.yaml"
    path.write_text("model: tiny\nbackend: vllm\ntrain: lora\nbase_quantization: int8\n")
    proc = subprocess.run(
        [sys.executable, "-m", "seedledger.engine.cli", "train", str(path), "--ledger", str(tmp_path / "l.db")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "use backend: hf" in proc.stderr


# -- relative paths in a config are the config file's; the run stores them absolute --


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    shutil.copy(DATA / "qa.jsonl", project / "data" / "qa.jsonl")
    shutil.copy(DATA / "user_reward.py", project / "my_reward.py")
    return project


def test_relative_paths_resolve_against_the_config_file(tmp_path, monkeypatch):
    project = _project(tmp_path)
    task = {"mix": [{"task": {"name": "jsonl", "path": "data/qa.jsonl", "test_size": 2,
                              "rewards": ["task", {"fn": "my_reward.py:shout", "weight": 0.5},
                                          "tests.support.rewards:vowel_share", "format"]},
                     "weight": 1},
                    {"task": "jsonl:data/qa.jsonl", "weight": 1}]}
    (project / "c.yaml").write_text(yaml.safe_dump({"task": task}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(project / "c.yaml")
    first, second = cfg.task["mix"]
    assert first["task"]["path"] == str(project / "data" / "qa.jsonl")
    assert first["task"]["rewards"] == [
        "task", {"fn": f"{project / 'my_reward.py'}:shout", "weight": 0.5},
        "tests.support.rewards:vowel_share", "format",  # a module and a built-in stay as they are
    ]
    assert second["task"] == f"jsonl:{project / 'data' / 'qa.jsonl'}"
    from seedledger.trainers.tasks import load_task

    assert load_task(first["task"]).test_rows()  # from any working directory
    # --set paths are the working directory's
    (elsewhere / "qa.jsonl").write_text((DATA / "qa.jsonl").read_text())
    assert load_config(project / "c.yaml", ["task=jsonl:qa.jsonl"]).task == f"jsonl:{elsewhere / 'qa.jsonl'}"
    assert load_config(None, [f"task=jsonl:{DATA / 'qa.jsonl'}"]).task == f"jsonl:{DATA / 'qa.jsonl'}"


def test_resume_from_another_directory(tmp_path, monkeypatch, tiny_model_dir):
    """Train from one directory with a config whose dataset and reward file are relative to
    it, resume from another: the stored config names the files absolutely."""
    from seedledger.engine.runtime import session
    from seedledger.ledger import Ledger

    project = _project(tmp_path)
    config = {
        "model": "tiny", "population": 2, "generations": 2, "batch_size": 2, "max_new_tokens": 4,
        "seed": 3, "sigma": 0.05, "lr": 0.05,
        "task": {"name": "jsonl", "path": "data/qa.jsonl", "test_size": 2,
                 "rewards": ["task", {"fn": "my_reward.py:shout"}]},
    }
    (project / "c.yaml").write_text(yaml.safe_dump(config))
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "a")
    with Ledger.open(str(tmp_path / "l.db")) as led:
        session.start(led, str(project / "c.yaml"), "r", [], 1)
        stored = led.get_run("r").config["task"]
        assert stored["path"] == str(project / "data" / "qa.jsonl")
        monkeypatch.chdir(tmp_path / "b")
        result = session.resume(led, "r", None, trust_code=True)  # the user's own reward file
        assert result.latest_generation == 2
