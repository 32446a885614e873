"""The README walkthrough, run as printed, then every command's `--json` on its ledger.

`test_readme_walkthrough_runs_as_printed` reads the README's walkthrough console block,
runs each `$ ` line through bash in a fresh directory (the venv's bin on PATH instead of
`source .venv/bin/activate`), expects exit 0, and finds every excerpt line printed below
a command in that command's real output: fingerprints, rewards and coefficients bit for
bit; only timing columns and the seed file's byte count (its header names the host) may
differ. So the README cannot drift from the commands. `test_walkthrough_json` then checks
train → log → show → fork → log --graph → diff → verify → export → rebuild (from the
ledger and from the seed file) through `--json` on the same ledger, and that bad input
exits 2 with one line and no traceback. Models come from the shared `$SEEDLEDGER_HOME`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import seedledger

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")
TABLE = "│┃"
VOLATILE_COLUMNS = {"seconds", "sec"}  # wall times differ from run to run
BYTES = re.compile(r"\(\d[\d,]* bytes\)")  # a seed file's header names the host


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SEEDLEDGER_DB"}
    env.setdefault("OMP_NUM_THREADS", "1")  # shared CI cores; results do not depend on it
    env["COLUMNS"] = "80"  # tables as a pipe or an 80-column terminal shows them
    return env | extra


class Cli:
    """Runs `seedledger` against one ledger (via $SEEDLEDGER_DB) in `workdir`: in this
    process unless `process` (tests.support.cli)."""

    def __init__(self, workdir: Path, ledger: str = "ledger.db"):
        self.workdir = workdir
        self.env = _env(SEEDLEDGER_DB=str(workdir / ledger))

    def run(self, *args: str, code: int = 0, process: bool = False) -> subprocess.CompletedProcess:
        started = time.perf_counter()
        proc = seedledger(args, cwd=self.workdir, env=self.env, process=process, timeout=300)
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


# -- the README's console block --------------------------------------------------------


def readme_steps(text: str | None = None) -> list[tuple[str, list[str]]]:
    """The walkthrough's console block: (command, the excerpt lines printed under it)."""
    text = README.read_text(encoding="utf-8") if text is None else text
    section = text[text.index("## Walkthrough"):]
    block = section.split("```console\n", 1)[1].split("\n```", 1)[0]
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif line.strip():
            assert steps, f"output before any command in the README block: {line!r}"
            steps[-1][1].append(line)
    return steps


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(f"[{TABLE}]", line.strip())]


def _plain(line: str) -> str:
    return " ".join(BYTES.sub("(N bytes)", line).split())


def excerpt_missing(excerpt: list[str], output: str) -> list[str]:
    """The excerpt lines that no line of `output` matches: table rows cell by cell (timing
    columns, named by the excerpt's last header row, excepted), other lines with their
    whitespace collapsed and byte counts masked."""
    out_lines = output.splitlines()
    missing, volatile = [], set()
    for line in excerpt:
        if line.lstrip()[:1] in TABLE:
            cells = _cells(line)
            if line.lstrip().startswith("┃"):
                volatile = {i for i, c in enumerate(cells) if c in VOLATILE_COLUMNS}
            found = any(
                len(o_cells) == len(cells)
                and all(a == b or i in volatile for i, (a, b) in enumerate(zip(cells, o_cells, strict=True)))
                for o_cells in (_cells(o) for o in out_lines if o.lstrip()[:1] in TABLE)
            )
        else:
            found = _plain(line) in {_plain(o) for o in out_lines}
        if not found:
            missing.append(line)
    return missing


def test_excerpt_matching_masks_only_timings_and_bytes():
    output = "│   1 │  -0.5 │    99.9 │ a022 │\nwrote x (1,200 bytes) for r@4\n"
    header = "┃ gen ┃  mean ┃ seconds ┃   fp ┃"
    assert excerpt_missing([header, "│   1 │  -0.5 │    10.3 │ a022 │"], output) == [header]
    assert excerpt_missing(["│   1 │  -0.5 │    10.3 │ a022 │"], output)  # no header: exact
    assert excerpt_missing([header, "│   1 │  -0.4 │    99.9 │ a022 │"], output)[1:]
    assert not excerpt_missing(["wrote x (1,113 bytes) for r@4"], output)
    assert excerpt_missing(["wrote y (1,113 bytes) for r@4"], output)


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory) -> tuple[Path, list[tuple[str, list[str], str]]]:
    """The README's block run as printed in a fresh directory: (directory, [(command,
    excerpt, output)])."""
    work = tmp_path_factory.mktemp("readme")
    return work, run_block(work, _env())


def run_block(work: Path, env: dict[str, str], in_process: bool = False) -> list[tuple[str, list[str], str]]:
    """Each `$ ` line of the README's block through bash in `work`, the venv's bin first on
    PATH (or, `in_process`, its `seedledger ARGS [> FILE]` lines through `seedledger()`);
    each must exit 0. Returns [(command, excerpt, output)]."""
    steps = readme_steps()
    assert steps[0][0] == "source .venv/bin/activate", "the block starts by activating the venv"
    env = env | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    results = []
    for command, excerpt in steps[1:]:
        started = time.perf_counter()
        words = shlex.split(command, comments=True)
        if in_process and words[0] == "seedledger":
            proc = _in_process(words[1:], work, env)
        else:
            proc = subprocess.run(
                ["bash", "-c", command], cwd=work, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, timeout=600,
            )
        print(f"{time.perf_counter() - started:6.1f}s  $ {command}\n{proc.stdout}")  # with -s
        assert proc.returncode == 0, f"$ {command}\nexited {proc.returncode}:\n{proc.stdout[-3000:]}"
        results.append((command, excerpt, proc.stdout))
    return results



def _in_process(args: list[str], work: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`seedledger ARGS [> FILE]` in this process; stdout then stderr as the output (bash's
    2>&1 interleaves them; excerpts are matched line by line)."""
    target = None
    if ">" in args:
        args, target = args[: args.index(">")], args[args.index(">") + 1]
    proc = seedledger(args, cwd=work, env=env)
    if target is not None:
        (work / target).write_text(proc.stdout)
        return subprocess.CompletedProcess(args, proc.returncode, proc.stderr)
    return subprocess.CompletedProcess(args, proc.returncode, proc.stdout + proc.stderr)

def test_readme_walkthrough_runs_as_printed(readme_run):
    _, results = readme_run
    _check_excerpts(results)


@pytest.mark.postgres
def test_readme_walkthrough_on_postgres(tmp_path: Path, pg_url: str) -> None:
    """The same block with `$SEEDLEDGER_DB` a PostgreSQL database: the same output, so the
    same fingerprints, rewards and coefficients, bit for bit (its seedledger commands in
    process: the block as printed through bash is the test above)."""
    _check_excerpts(run_block(tmp_path, _env(SEEDLEDGER_DB=pg_url), in_process=True))


def _check_excerpts(results: list[tuple[str, list[str], str]]) -> None:
    for command, excerpt, output in results:
        missing = excerpt_missing(excerpt, output)
        assert not missing, f"$ {command}\nREADME lines not in the output:\n" + "\n".join(
            missing) + f"\n--- output:\n{output}"
    assert any(excerpt for _, excerpt, _ in results), "the block shows output"


def test_walkthrough_json(readme_run):
    work, _ = readme_run
    cli = Cli(work, "seedledger.db")

    # log: every run
    runs = cli.json("log")
    assert [r["name"] for r in runs] == ["first", "lower-lr"]
    first = runs[0]
    assert first["base_model"] == "tiny" and first["generations"] == 3 and first["parent"] is None
    assert first["status"] == "finished" and runs[1]["status"] == "finished"
    assert first["best_reward"] is not None and first["best_generation"] in (1, 2, 3)
    assert "first" in cli.run("log").stdout

    # log RUN: its generations; log RUN@G: up to G
    log = cli.json("log", "first")
    gens = log["generations"]
    assert [g["generation"] for g in gens] == [1, 2, 3] and {g["run"] for g in gens} == {"first"}
    fingerprint = gens[-1]["fingerprint"]
    assert HEX32.match(fingerprint)
    for g in gens:
        assert g["population"] == 4 and g["lr"] > 0 and g["sigma"] > 0 and g["seconds"] > 0
        assert g["reward_min"] <= g["reward_mean"] <= g["reward_max"]
    assert any(e["kind"] == "create" for e in log["events"])
    assert [g["generation"] for g in cli.json("log", "first@2")["generations"]] == [1, 2]

    # show RUN@G, with one member's stored outputs
    shown = cli.json("show", "first@3", "--samples", "1")
    assert shown["run"] == "first" and shown["generation"] == 3
    assert shown["fingerprint"] == fingerprint
    assert shown["hyperparameters"]["population"] == 4
    assert shown["hyperparameters"]["optimizer"]["name"]
    assert len(shown["batch_indices"]) == 4 and shown["timings"]
    members = shown["members"]
    assert [m["index"] for m in members] == [0, 1, 2, 3]
    for even, odd in zip(members[::2], members[1::2], strict=True):  # mirrored pairs
        assert even["key"] == odd["key"] and (even["sign"], odd["sign"]) == (1, -1)
    # keys are strings (JSON numbers lose 64-bit precision), as the tables print them
    assert all(HEX16.match(m["key"]) and isinstance(m["coefficient"], float) for m in members)
    assert all(set(m["components"]) == {"arithmetic", "length"} for m in members)
    assert any(m["coefficient"] != 0.0 for m in members), "rewards did not differ"
    assert [("samples" in m) for m in members] == [False, True, False, False]
    samples = members[1]["samples"]
    assert len(samples) == 4
    assert all(isinstance(s["completion"], str) for s in samples)
    assert all(s["prompt"].startswith("What is") and "answer" in s["data"] for s in samples)
    human = cli.run("show", "first@3", "1", "--samples").stdout
    assert "expected" in human and samples[0]["prompt"] in human

    # the fork at generation 2 with another learning rate
    child_log = cli.json("log", "lower-lr")
    assert [(g["generation"], g["run"]) for g in child_log["generations"]] == [
        (1, "first"), (2, "first"), (3, "lower-lr"), (4, "lower-lr")]
    assert child_log["run"]["parent"] == "first@2"
    assert child_log["generations"][2]["lr"] == pytest.approx(0.0002)
    child_fp = child_log["generations"][-1]["fingerprint"]

    # log --graph: the fork tree
    (root,) = cli.json("log", "--graph")
    assert root["name"] == "first" and root["forked_at"] is None
    assert [(c["name"], c["forked_at"], c["generations"]) for c in root["children"]] == [("lower-lr", 2, 4)]

    # diff across the fork: replayed from their shared generations 1..2
    d = cli.json("diff", "first@3", "lower-lr@3")
    assert d["a"] == {"run": "first", "generation": 3, "fingerprint": fingerprint}
    assert d["b"]["run"] == "lower-lr" and d["shared_generations"] == 2
    l2s = [t["l2"] for t in d["tensors"]]
    assert l2s == sorted(l2s, reverse=True) and len(l2s) == d["total"]["tensors"]
    assert d["total"]["l2"] == pytest.approx(math.sqrt(sum(x * x for x in l2s)))
    assert d["total"]["max_abs"] == max(t["max_abs"] for t in d["tensors"]) > 0
    assert d["total"]["numel"] == sum(t["numel"] for t in d["tensors"])

    # verify, export, rebuild from the ledger; the README rebuilt from the seed file alone
    verified = cli.json("verify", "lower-lr")
    assert verified["ok"] is True and verified["generation"] == 4
    assert verified["fingerprint"] == child_fp
    exported = cli.json("export", "lower-lr@4", "-o", "child.seeds")
    assert exported["generation"] == 4 and exported["bytes"] == (work / "child.seeds").stat().st_size
    from_ledger = cli.json("rebuild", "lower-lr@4", "-o", "rebuilt-ledger")
    from_file = cli.json("rebuild", "child.seeds", "--base", "tiny", "-o", "rebuilt-seeds")
    assert from_ledger["fingerprint"] == from_file["fingerprint"] == child_fp
    mode = 0o777 & ~_umask()
    assert (work / "rebuilt-ledger").stat().st_mode & 0o777 == mode, "rebuild follows the umask"
    assert (work / "rebuilt-ledger" / "model.safetensors").stat().st_mode & 0o777 == mode & 0o666

    # the rebuilt directories load with transformers and hold the same weights
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = AutoModelForCausalLM.from_pretrained(work / "rebuilt-ledger")
    b = AutoModelForCausalLM.from_pretrained(work / "lower-lr-model")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(sa[k].equal(sb[k]) for k in sa)
    assert AutoTokenizer.from_pretrained(work / "rebuilt-seeds")("1 + 1")["input_ids"]

    # plot: several runs on one axis
    plotted = cli.json("plot", "first", "--forks", "-o", "tree.png")
    assert [(r["run"], r["forked_at"]) for r in plotted["runs"]] == [("first", None), ("lower-lr", "first@2")]
    assert (work / "tree.png").stat().st_size > 0

    # bad input: exit 2, one line naming the problem, no traceback unless --debug
    assert "nope" in cli.bad("log", "nope", "--ledger", str(work / "seedledger.db"))
    assert "first@3" in cli.bad("show", "first@999")
    data = bytearray((work / "child.seeds").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (work / "corrupt.seeds").write_bytes(bytes(data))
    cli.bad("rebuild", "corrupt.seeds", "--base", "tiny", "-o", "never")
    assert not (work / "never").exists()
    debug = cli.run("--debug", "log", "nope", code=2)
    assert "Traceback" in debug.stderr


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
