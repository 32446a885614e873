"""Issue 31 item 3: `rebuild` estimates the memory its replay needs (fp32 base plus one
copy of the trained weights per optimizer moment or path) from the file or ledger and the
base's safetensors headers, and refuses in one line above a bound (the machine's available
memory, or SEEDLEDGER_REBUILD_MEMORY_MB), before anything is loaded or written. A real
GA-survivors run on `tiny` (a LoRA adapter, two paths), the console script as a subprocess."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from test_ga_survivors import CONFIG as GA

from seedledger.engine.rebuild.memory import ENV, MIB, estimate_bytes, model_params, step_buffers
from seedledger.replay.adapter import LoraSpec
from tests.support.runs import cli


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("rebuild_memory")
    (tmp / "ga.yaml").write_text(yaml.safe_dump(GA | {"generations": 2}))
    cli("train", tmp / "ga.yaml", "--run", "g", "--ledger", tmp / "l.db")
    cli("export", "g@2", "-o", tmp / "g.seeds", "--ledger", tmp / "l.db")
    return tmp


def _need_mib(model_dir: Path) -> float:
    """What the estimate says for the run: survivors 3 keep two paths over q_proj/v_proj's LoRA."""
    spec = LoraSpec(rank=4, alpha=8.0, targets=("q_proj", "v_proj"), init="seed:0")
    return estimate_bytes(*model_params(model_dir, spec), 2) / MIB


def _refused(*args, cap: float | str) -> str:
    proc = cli(*args, env=os.environ | {ENV: str(cap)}, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[0]


def test_the_estimate_is_the_base_plus_a_copy_of_the_trained_weights_per_buffer(tiny_model_dir):
    assert [step_buffers(o) for o in (None, {"name": "sgd"}, {"name": "momentum"}, {"name": "adam"},
                                      {"name": "paths", "move": [0.0] * 256})] == [0, 0, 1, 2, 256]
    assert estimate_bytes(1000, 10, 3) == 4 * (1000 + 30)
    spec = LoraSpec(rank=4, alpha=8.0, targets=("q_proj",), init="seed:0")
    base, full = model_params(tiny_model_dir, None)
    _, lora = model_params(tiny_model_dir, spec)
    assert base == full > 1_000_000 and 0 < lora < base // 10


def test_a_replay_above_the_bound_is_refused_in_one_line_before_any_work(run, tiny_model_dir, tmp_path):
    need = _need_mib(tiny_model_dir)
    out = tmp_path / "out"
    line = _refused("rebuild", run / "g.seeds", "-o", out, cap=need * 0.99)
    assert line.startswith(f"error: {run / 'g.seeds'}: replaying needs about {need:,.1f} MiB"), line
    assert "plus 2 optimizer/path copies" in line and f"{need * 0.99:,.1f} MiB ({ENV})" in line, line
    line = _refused("rebuild", "g@2", "-o", out, "--ledger", run / "l.db", cap=need * 0.99)
    assert line.startswith(f"error: g@2: replaying needs about {need:,.1f} MiB"), line
    assert not out.exists()
    assert f"{ENV}='lots'" in _refused("rebuild", run / "g.seeds", "-o", out, cap="lots")
    assert not out.exists()


def test_a_replay_within_the_bound_rebuilds(run, tiny_model_dir, tmp_path):
    capped = os.environ | {ENV: str(_need_mib(tiny_model_dir) * 1.01)}
    cli("rebuild", run / "g.seeds", "-o", tmp_path / "capped", env=capped)
    cli("rebuild", "g@2", "-o", tmp_path / "free", "--ledger", run / "l.db")  # the machine's memory: plenty
    assert (tmp_path / "capped" / "seedledger.json").exists() and (tmp_path / "free" / "seedledger.json").exists()
