"""The Triton kernels equal the torch reference bit for bit, checked without a GPU.

The checks (tests/support/triton_checks.py) run in one fresh process with
``TRITON_INTERPRET=1`` (Triton's interpreter runs the kernels on CPU tensors in numpy) and
``SEEDLEDGER_REPLAY_IMPL=triton`` (the public functions route CPU tensors to the Triton
kernels). A subprocess is needed because the interpreter is chosen when triton is
imported, and other tests may have imported it already; one process serves every check
(each reports `ok NAME` or `FAIL NAME` with its traceback). The interpreter says nothing
about GPU-only float behaviour (FMA contraction, approximate division/sqrt, flushed
subnormals): ``replay/_triton_kernels.py`` explains how the launches rule those out, and
tests/test_gpu.py compares CUDA with CPU.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.triton_checks import CHECKS, SKIP

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reports() -> dict[str, str]:
    """Each check's report from one interpreter process: {name: "ok" or its traceback}."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    env = {**os.environ, "TRITON_INTERPRET": "1", "SEEDLEDGER_REPLAY_IMPL": "triton",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "tests.support.triton_checks"], env=env, capture_output=True,
                         text=True, timeout=1800, cwd=ROOT)
    if SKIP in res.stdout:
        pytest.skip(res.stdout.strip())
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    found = re.split(r"^(ok|FAIL) (\w+)$", res.stdout, flags=re.M)[1:]
    triples = zip(*[iter(found)] * 3, strict=True)
    return {name: (outcome if outcome == "ok" else detail) for outcome, name, detail in triples}


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.slow
def test_triton_kernels_in_interpreter(reports, check):
    assert reports.get(check) == "ok", reports.get(check, "the check did not run")
