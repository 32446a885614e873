"""The README walkthrough, end to end through the console script on the `tiny` model.

train → log → log RUN → show → fork → log --graph → diff → verify → export → rebuild (from
the ledger and from the seed file) → load with transformers; every command's `--json`
output is parsed and checked, and bad input must exit 2 with one line and no traceback.
Models come from the shared `$SEEDLEDGER_HOME` cache; the ledger lives in tmp_path.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# The arithmetic reward is 0 for a random model; a length penalty makes rewards differ, so
# coefficients are non-zero and the fork really moves away from its parent.
CONFIG = """\
model: tiny
task:
  name: arithmetic
  rewards: [task, {fn: length, limit: 40}]
population: 4
generations: 2
batch_size: 4
max_new_tokens: 8
keep_samples: true
seed: 7
"""
HEX32 = re.compile(r"^[0-9a-f]{32}$")


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("seedledger")
    return [str(script)] if script.exists() else [sys.executable, "-m", "engine.cli"]


class Cli:
    """Runs `seedledger` in a subprocess against one ledger (via $SEEDLEDGER_DB)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.env = {**os.environ, "SEEDLEDGER_DB": str(workdir / "ledger.db")}
        self.env.setdefault("OMP_NUM_THREADS", "1")  # shared CI cores; results do not depend on it

    def run(self, *args: str, code: int = 0) -> subprocess.CompletedProcess:
        started = time.perf_counter()
        proc = subprocess.run(
            [*_cli(), *args], cwd=self.workdir, env=self.env, capture_output=True, text=True,
            timeout=300,
        )
        print(f"{time.perf_counter() - started:6.1f}s  seedledger {' '.join(args)}")  # shown with -s
        assert proc.returncode == code, (
            f"seedledger {' '.join(args)} exited {proc.returncode}, expected {code}\n"
            f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-3000:]}"
        )
        return proc

    def json(self, *args: str):
        return json.loads(self.run(*args, "--json").stdout)

    def bad(self, *args: str, code: int = 2) -> str:
        """Bad input: exit `code`, one line on stderr, no traceback; returns that line."""
        err = self.run(*args, code=code).stderr
        assert "Traceback" not in err, err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        return lines[0]


_FINGERPRINTS: dict[str, dict[str, str]] = {}  # the SQLite walkthrough's, for PostgreSQL's


def test_walkthrough(tmp_path: Path) -> None:
    _FINGERPRINTS["sqlite"] = walkthrough(Cli(tmp_path), tmp_path)


@pytest.mark.postgres
def test_walkthrough_on_postgres(tmp_path: Path, pg_url: str) -> None:
    """The same walkthrough with a postgresql+psycopg:// ledger: the same fingerprints."""
    if "sqlite" not in _FINGERPRINTS:  # run alone: make the SQLite reference first
        (tmp_path / "sqlite").mkdir()
        _FINGERPRINTS["sqlite"] = walkthrough(Cli(tmp_path / "sqlite"), tmp_path / "sqlite")
    cli = Cli(tmp_path)
    cli.env["SEEDLEDGER_DB"] = pg_url
    assert walkthrough(cli, tmp_path) == _FINGERPRINTS["sqlite"]


def walkthrough(cli: Cli, tmp_path: Path) -> dict[str, str]:
    """Every step, checked; returns the fingerprints it saw (train, fork, rebuilds)."""
    (tmp_path / "arith.yaml").write_text(CONFIG)

    # train
    trained = cli.json("train", "arith.yaml", "--run", "base")
    assert trained["run"] == "base" and trained["generations_committed"] == [1, 2]
    assert HEX32.match(trained["fingerprint"])

    # log: every run
    runs = cli.json("log")
    assert [r["name"] for r in runs] == ["base"]
    (base,) = runs
    assert base["base_model"] == "tiny" and base["generations"] == 2 and base["parent"] is None
    assert base["best_reward"] is not None and base["best_generation"] in (1, 2)
    assert "base" in cli.run("log").stdout

    # log RUN: its generations
    log = cli.json("log", "base")
    gens = log["generations"]
    assert [g["generation"] for g in gens] == [1, 2] and {g["run"] for g in gens} == {"base"}
    assert gens[-1]["fingerprint"] == trained["fingerprint"]
    for g in gens:
        assert g["population"] == 4 and g["lr"] > 0 and g["sigma"] > 0 and g["seconds"] > 0
        assert g["reward_min"] <= g["reward_mean"] <= g["reward_max"]
    assert any(e["kind"] == "create" for e in log["events"])

    # show RUN@G, with one member's stored outputs
    shown = cli.json("show", "base@2", "--samples", "1")
    assert shown["run"] == "base" and shown["generation"] == 2
    assert shown["fingerprint"] == trained["fingerprint"]
    assert shown["hyperparameters"]["population"] == 4
    assert shown["hyperparameters"]["optimizer"]["name"]
    assert len(shown["batch_indices"]) == 4 and shown["timings"]
    members = shown["members"]
    assert [m["index"] for m in members] == [0, 1, 2, 3]
    for even, odd in zip(members[::2], members[1::2], strict=True):  # mirrored pairs
        assert even["key"] == odd["key"] and (even["sign"], odd["sign"]) == (1, -1)
    assert all(0 <= m["key"] < 2**64 and isinstance(m["coefficient"], float) for m in members)
    assert all(set(m["components"]) == {"arithmetic", "length"} for m in members)
    assert any(m["coefficient"] != 0.0 for m in members), "rewards did not differ"
    assert [("samples" in m) for m in members] == [False, True, False, False]
    assert len(members[1]["samples"]) == 4
    assert all(isinstance(s["completion"], str) for s in members[1]["samples"])

    # fork at generation 1 with another learning rate
    forked = cli.json("fork", "base@1", "--run", "child", "--set", "lr=0.01", "--generations", "1")
    assert forked["run"] == "child" and forked["generations_committed"] == [2]
    child_log = cli.json("log", "child")
    assert [(g["generation"], g["run"]) for g in child_log["generations"]] == [(1, "base"), (2, "child")]
    assert child_log["run"]["parent"] == "base@1"
    assert child_log["generations"][1]["lr"] == pytest.approx(0.01)

    # log --graph: the fork tree
    (root,) = cli.json("log", "--graph")
    assert root["name"] == "base" and root["forked_at"] is None
    assert [(c["name"], c["forked_at"], c["generations"]) for c in root["children"]] == [("child", 1, 2)]
    assert "child" in cli.run("log", "--graph").stdout

    # diff across the fork: replayed from their shared generation 1
    d = cli.json("diff", "base@2", "child@2")
    assert d["a"] == {"run": "base", "generation": 2, "fingerprint": trained["fingerprint"]}
    assert d["b"]["fingerprint"] == forked["fingerprint"] and d["shared_generations"] == 1
    l2s = [t["l2"] for t in d["tensors"]]
    assert l2s == sorted(l2s, reverse=True) and len(l2s) == d["total"]["tensors"]
    assert d["total"]["l2"] == pytest.approx(math.sqrt(sum(x * x for x in l2s)))
    assert d["total"]["max_abs"] == max(t["max_abs"] for t in d["tensors"]) > 0
    assert d["total"]["numel"] == sum(t["numel"] for t in d["tensors"])

    # verify, export, rebuild from the ledger and from the seed file alone
    verified = cli.json("verify", "child")
    assert verified["ok"] is True and verified["generation"] == 2
    assert verified["fingerprint"] == forked["fingerprint"]
    exported = cli.json("export", "child@2", "-o", "child.seeds")
    assert exported["generation"] == 2 and exported["bytes"] == (tmp_path / "child.seeds").stat().st_size
    from_ledger = cli.json("rebuild", "child@2", "-o", "rebuilt-ledger")
    from_file = cli.json("rebuild", "child.seeds", "--base", "tiny", "-o", "rebuilt-seeds")
    assert from_ledger["fingerprint"] == from_file["fingerprint"] == forked["fingerprint"]

    # the rebuilt directories load with transformers and hold the same weights
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = AutoModelForCausalLM.from_pretrained(tmp_path / "rebuilt-ledger")
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "rebuilt-seeds")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(sa[k].equal(sb[k]) for k in sa)
    assert AutoTokenizer.from_pretrained(tmp_path / "rebuilt-seeds")("1 + 1")["input_ids"]

    # bad input: exit 2, one line naming the problem, no traceback unless --debug
    assert "nope" in cli.bad("log", "nope", "--ledger", cli.env["SEEDLEDGER_DB"])
    assert "base@2" in cli.bad("show", "base@999")
    data = bytearray((tmp_path / "child.seeds").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "corrupt.seeds").write_bytes(bytes(data))
    cli.bad("rebuild", "corrupt.seeds", "--base", "tiny", "-o", "never")
    assert not (tmp_path / "never").exists()
    debug = cli.run("--debug", "log", "nope", code=2)
    assert "Traceback" in debug.stderr
    return {"base": trained["fingerprint"], "child": forked["fingerprint"],
            "rebuilt": from_ledger["fingerprint"], "verified": verified["fingerprint"]}
