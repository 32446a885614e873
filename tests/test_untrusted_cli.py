"""Ledgers, seed files, names and settings from anyone (issue 13 items 3 to 13), through
the console script on `tiny`. Every hostile file or ledger is made here, from a real run:
a copied ledger is edited with plain SQL, a seed file re-written with a valid checksum.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from test_cli_walkthrough import Cli

from tests.support import ledgerforge, seedforge
from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow


def train_r(work: Path) -> Path:
    """A ledger in `work` holding run `r` (2 generations of `tiny`) and its seed file `r.seeds`."""
    (work / "c.yaml").write_text(tiny_config(sigma=0.05, lr=0.01))
    cli = Cli(work)
    cli.json("train", "c.yaml", "--run", "r")
    cli.json("export", "r", "-o", "r.seeds")
    return work


def copy_of(trained: Path, workdir: Path) -> Cli:
    """A fresh working directory with copies of the trained ledger, seed file and config."""
    for name in ("ledger.db", "r.seeds", "c.yaml"):
        shutil.copy(trained / name, workdir / name)
    return Cli(workdir)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return train_r(tmp_path_factory.mktemp("trained"))


@pytest.fixture
def cli(tmp_path, trained) -> Cli:
    return copy_of(trained, tmp_path)


def _sql(cli: Cli, statement: str, *args) -> list[tuple]:
    """Edit the ledger as anyone can who has a copy of it."""
    con = sqlite3.connect(cli.workdir / "ledger.db")
    try:
        with con:
            return con.execute(statement, args).fetchall()
    finally:
        con.close()


def _runs(cli: Cli) -> list[str]:
    return [r["name"] for r in cli.json("log")]


def _set_config(cli: Cli, run: str, **keys) -> None:
    config = json.loads(_sql(cli, "SELECT config FROM runs WHERE name = ?", run)[0][0])
    _sql(cli, "UPDATE runs SET config = ? WHERE name = ?", json.dumps({**config, **keys}), run)
    ledgerforge.rechain(cli.workdir / "ledger.db")  # a forger recomputes the hash chain


def _set_task(cli: Cli, run: str, task) -> None:
    _set_config(cli, run, task=task)


# -- item 3: code named by a ledger or seed file runs only with --trust-code ------------------

EVIL = """\
from pathlib import Path
Path(__file__).with_name("pwned").write_text("imported")


def f(prompts, completions, **columns):
    return [0.0] * len(completions)
"""


def test_reward_code_named_by_a_ledger_needs_trust_code(cli):
    work = cli.workdir
    (work / "evil.py").write_text(EVIL)
    ref = f"{work / 'evil.py'}:f"
    _set_task(cli, "r", {"name": "arithmetic", "rewards": ["task", {"fn": ref}]})
    for args in (["resume", "r"], ["fork", "r@1", "--run", "k"]):
        line = cli.bad(*args)
        assert ref in line and "--trust-code" in line, line
    assert not (work / "pwned").exists() and _runs(cli) == ["r"]

    # a relative reference would be resolved against the working directory: never
    _set_task(cli, "r", {"name": "arithmetic", "rewards": ["task", "evil.py:f"]})
    assert "relative path" in cli.bad("resume", "r", "--trust-code")
    assert not (work / "pwned").exists()

    # a seed file naming any importable module: importing the file runs nothing, resuming
    # the run it made is refused
    def module(header: dict, arrays: bytearray) -> None:
        header["config"]["task"] = {"name": "arithmetic", "rewards": ["task", "this:f"]}

    seedforge.forge(work / "r.seeds", work / "this.seeds", module)
    proc = cli.run("import", "this.seeds", "--run", "imp")
    assert "Beautiful is better" not in proc.stdout + proc.stderr  # `this` was not imported
    line = cli.bad("resume", "imp")
    assert "'this:f'" in line and "--trust-code" in line

    # a Ray cluster to join is code too: it answers with pickles
    _set_config(cli, "r", task="arithmetic", workers={"pool": "ray", "count": 1, "address": "127.0.0.1:1"})
    line = cli.bad("fork", "r@1", "--run", "k")
    assert "workers.address=127.0.0.1:1" in line and "--trust-code" in line
    _set_config(cli, "r", workers={"pool": "local", "count": 1, "address": None})

    # the user says so: the code runs
    _set_task(cli, "r", {"name": "arithmetic", "rewards": ["task", {"fn": ref}]})
    cli.json("resume", "r", "--generations", "1", "--trust-code")  # 0 would load no task at all
    assert (work / "pwned").read_text() == "imported"


# -- items 4 and 5: run names, paths and terminals ----------------------------------------------


def test_run_names_follow_one_grammar(cli):
    work = cli.workdir
    for name in ("../../x", str(work / "abs"), "..", ".", "a/b", "-dash", "a\tb", "a\nb", "x\x1b[2J"):
        line = cli.bad("train", "c.yaml", f"--run={name}")
        assert "bad run name" in line and "\x1b" not in line, line
    assert "bad run name" in cli.bad("fork", "r@1", "--run", "../k")
    assert "bad run name" in cli.bad("import", "r.seeds", "--run", "a/b")

    def named(header: dict, arrays: bytearray) -> None:
        header["run"] = "../../evil\x1b]0;pwned\x07\x1b[2J"

    seedforge.forge(work / "r.seeds", work / "named.seeds", named)
    line = cli.bad("import", "named.seeds")
    assert "not a valid run name" in line and "--run NAME" in line
    assert "\x1b" not in line and "\x07" not in line and "\\x1b" in line
    assert _runs(cli) == ["r"]
    assert cli.json("import", "named.seeds", "--run", "good")["run"] == "good"
    assert not list(work.glob("**/pwned*")) and not (work.parent / "evil").exists()


def test_a_ledger_with_old_names_still_reads_and_never_leaves_its_directories(cli):
    """A name from before the grammar (here with a path and terminal escapes in it) still
    lists, shows, verifies and exports, prints escaped, resumes with its TensorBoard
    files inside logs/tensorboard, and forks under a valid name (the migration path)."""
    work = cli.workdir
    cli.env["COLUMNS"] = "250"  # tables wide enough that no name wraps
    old = "../../up\x1b]0;pwned\x07\x1b[2J"
    _sql(cli, "UPDATE runs SET name = ? WHERE name = 'r'", old)
    config = json.loads(_sql(cli, "SELECT config FROM runs")[0][0])
    _sql(cli, "UPDATE runs SET config = ?", json.dumps({**config, "report_to": ["tensorboard"]}))
    ledgerforge.rechain(work / "ledger.db")  # an old ledger's chain was made with its names
    for args in (["log"], ["log", "--graph"], ["log", old], ["show", f"{old}@1"]):
        out = cli.run(*args).stdout
        assert "\x1b" not in out and "\x07" not in out and "up\\x1b]0;pwned\\x07" in out, (args, out)
    line = cli.bad("show", f"{old}@9")
    assert "\x1b" not in line and "\\x1b" in line
    assert cli.json("verify", old)["ok"] is True
    cli.json("export", old, "-o", "old.seeds")

    cli.json("resume", old, "--generations", "1")  # 0 would start no logger
    written = [p for p in work.rglob("*") if p.is_file() and "tfevents" in p.name]
    assert written and all(p.parent.parent == work / "logs" / "tensorboard" for p in written)
    assert written[0].parent.name.startswith("run-")
    assert not (work.parent.parent / "up").exists()

    cli.json("fork", f"{old}@2", "--run", "renamed", "--generations", "0")
    assert cli.json("verify", "renamed")["ok"] is True


# -- item 6: anchor rows are data, not paths to open ------------------------------------------


def test_anchor_rows_never_make_replay_read_what_they_name(cli):
    """Rows naming /dev/zero, a huge size, or a symlink to /dev/zero in the anchors
    directory: rebuild and resume fall back to replay and reach the ledger's fingerprint."""
    work = cli.workdir
    adir = work / "ledger.db.anchors"
    adir.mkdir()
    (adir / f"{'b' * 64}.safetensors.zst").symlink_to("/dev/zero")
    rid = _sql(cli, "SELECT id FROM runs WHERE name = 'r'")[0][0]
    for g, sha, size in ((1, "a" * 64, 10**12), (2, "b" * 64, 1 << 20)):
        _sql(cli, "INSERT INTO anchors (run_id, generation, path, sha256, fingerprint, size, created_at) "
                  "VALUES (?, ?, '/dev/zero', ?, ?, ?, '2025-01-01 00:00:00')", rid, g, sha, "0" * 32, size)
    want = cli.json("log", "r")["generations"][-1]["fingerprint"]
    assert cli.json("rebuild", "r", "-o", "out")["fingerprint"] == want
    assert cli.json("resume", "r", "--generations", "0")["fingerprint"] == want


# -- item 7: settings that cannot work are refused before a run exists ---------------------------


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("sigma=.inf", "sigma"),
        ("sigma=1e308", "sigma"),
        ("sigma=1e-320", "sigma"),
        ("lr=.nan", "lr"),
        ("population=100000", "population"),
        ("population=1000000000000", "population"),
        ("batch_size=1000000000", "batch_size"),
        ("max_new_tokens=1000000000", "max_new_tokens"),
        ("generations=1048576", "exported"),  # x population 4: more than a seed file holds
        ("task={name: arithmetic, rewards: [{fn: length, weight: .nan}]}", "weight"),
        ("task={name: arithmetic, rewards: [{fn: length, limit: .inf}]}", "limit"),
        ("optimizer={name: adam, eps: .inf}", "eps"),
    ],
)
def test_settings_out_of_range_are_refused_before_the_run_exists(cli, setting, key):
    line = cli.bad("train", "c.yaml", "--run", "s", "--set", setting)
    assert key in line, line
    assert _runs(cli) == ["r"]


# -- item 8: what one import may cost, and what one screen shows -------------------------------


def _wide(header: dict, arrays: bytearray, population: int) -> bytes:
    """`header` made one generation of `population` members (keys index 0, coefficient 0)."""
    seg = dict(header["segments"][0], first=1, last=1)
    g = header["generations"]
    fp = g["fingerprint"][0]
    header.update(generation=1, segments=[seg], final_fingerprint=fp, keys="index-u16", coefficients="f32hi20")
    g.update(population=[population], sigma=g["sigma"][:1], lr=g["lr"][:1],
             schedule_step=[1], optimizer_of=[0], fingerprint=[fp])
    return b"\x01" * population + b"\x00" * (population * (2 + 3))


def test_import_is_bounded_and_big_generations_page(cli):
    work = cli.workdir

    def huge(header: dict, arrays: bytearray) -> bytes:
        """5 generations of 60,000 members, refused from the header alone (no arrays)."""
        g = header["generations"]
        header.update(generation=5, segments=[dict(header["segments"][0], first=1, last=5)],
                      final_fingerprint=g["fingerprint"][0])
        g.update(population=[60_000] * 5, sigma=g["sigma"][:1] * 5, lr=g["lr"][:1] * 5,
                 schedule_step=[1, 2, 3, 4, 5], optimizer_of=[0] * 5, fingerprint=g["fingerprint"][:1] * 5)
        return b""

    seedforge.forge(work / "r.seeds", work / "huge.seeds", huge)
    line = cli.bad("import", "huge.seeds", "--run", "h")
    assert "300,000 members" in line and "--max-members 300000" in line, line

    seedforge.forge(work / "r.seeds", work / "wide.seeds", lambda h, a: _wide(h, a, 250))
    assert "--max-members 250" in cli.bad("import", "wide.seeds", "--run", "w", "--max-members", "100")
    assert cli.json("import", "wide.seeds", "--run", "w", "--max-members", "250")["run"] == "w"
    out = cli.run("show", "w@1").stdout
    assert "… 150 more members not shown (--json lists all)" in out
    assert len(out.splitlines()) < 130
    assert len(cli.json("show", "w@1")["members"]) == 250


# -- item 9: well-formed but absurd values are refused at import ---------------------------------


def _coefficients(value: float):
    def edit(header: dict, arrays: bytearray) -> bytes:
        m = sum(header["generations"]["population"])
        return seedforge.with_coefficients(header, arrays, [value] * m)

    return edit


def _header(where: str, key: str, value):
    def edit(header: dict, arrays: bytearray) -> None:
        node = {"top": header, "segment": header["segments"][0], "gens": header["generations"]}[where]
        node[key] = value(node[key]) if callable(value) else value

    return edit


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (_coefficients(float("inf")), "coefficient inf is not finite"),
        (_coefficients(1e308), "coefficient 1e+308"),
        (_coefficients(0.1), "coefficient 0.1 "),
        (_header("gens", "sigma", lambda s: [0.0] * len(s)), "σ 0.0"),
        (_header("gens", "sigma", lambda s: [-x for x in s]), "σ -"),
        (_header("gens", "fingerprint", lambda f: ["zz", *f[1:]]), "'zz' is not 32 lowercase hex"),
        (_header("segment", "noise_spec", "v9"), "unknown noise spec 'v9'"),
        (_header("top", "noise_spec", "v9"), "unknown noise spec 'v9'"),
        (_header("segment", "param_selection", "suffix:q_proj"), "parameter selection must be 'all'"),
    ],
    ids=["inf", "1e308", "unrounded", "sigma0", "sigma<0", "fingerprint", "segment-v9", "v9", "selection"],
)
def test_import_refuses_values_no_run_could_have_written(cli, edit, needle):
    seedforge.forge(cli.workdir / "r.seeds", cli.workdir / "bad.seeds", edit)
    line = cli.bad("import", "bad.seeds", "--run", "x")
    assert needle in line, line
    assert _runs(cli) == ["r"]


# -- item 10: the environment's errors are one line, exit 2 -------------------------------------
