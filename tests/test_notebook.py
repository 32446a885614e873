"""examples/quickstart.ipynb runs top to bottom (nbclient, a real ipykernel on this
venv's python), so the notebook cannot rot: train, table, plot, fork, diff, verify, SQL,
export, rebuild from the seed file, generate."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def test_quickstart_notebook_runs_top_to_bottom(tmp_path, tiny_model_dir):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit it without outputs"
    env = {k: v for k, v in os.environ.items() if k != "SEEDLEDGER_DB"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # `!seedledger`
    env["TMPDIR"] = str(tmp_path)  # the notebook's working directory lands under tmp_path
    env.setdefault("OMP_NUM_THREADS", "1")
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute(env=env)  # a cell that raises fails here (CellExecutionError)

    outputs = {i: c.outputs for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    text = "\n".join(
        o.get("text", "") + o.get("data", {}).get("text/plain", "")
        for cell in outputs.values() for o in cell
    )
    assert text.count("generation 1: reward mean") == 1 and "generation 4: reward mean" in text  # progress
    assert "total" in text and "20 tensors" in text  # the `seedledger diff` table
    assert "'ok': True" in text  # verify
    assert "seed file: " in text and "bytes" in text
    assert any(o.get("data", {}).get("image/png") for cell in outputs.values() for o in cell)  # the plot
    assert list(tmp_path.glob("seedledger-quickstart-*/lower-lr-model/seedledger.json"))
