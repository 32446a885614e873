"""Many writers, one ledger: 8 `seedledger train` processes, each its own run, commit into
one SQLite file or one PostgreSQL database at once; three are SIGKILLed after their first
commit and resumed, taking over their dead sessions' leases (logged). On PostgreSQL a Ray
pool of 2 workers trains a ninth run beside them. Nothing is lost or duplicated, every
chain checks, every run verifies by replay, and the Ray run reaches the local one's bits."""

from __future__ import annotations

import json
import subprocess

import pytest
import sqlalchemy as sa
from test_cli_walkthrough import Cli

from seedledger.ledger import Ledger
from tests.support.cli import script
from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow

WRITERS = 8
KILLED = (1, 4, 6)  # SIGKILLed right after committing generation 1, then resumed


def _start(cli: Cli, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*script(), *args, "--json"], cwd=cli.workdir, env={**cli.env, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(procs: dict[str, subprocess.Popen]) -> dict[str, tuple[int, str, str]]:
    return {name: (p.wait(timeout=900), *p.communicate()) for name, p in procs.items()}


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.ray])])
def test_eight_writers_one_ledger(tmp_path, request, db, tiny_model_dir):
    url = str(tmp_path / "ledger.db") if db == "sqlite" else request.getfixturevalue("pg_url")
    cli = Cli(tmp_path)
    cli.env["SEEDLEDGER_DB"] = url
    (tmp_path / "c.yaml").write_text(tiny_config(generations=2))
    Ledger.open(url).close()  # the schema first: the writers race on runs, not on creation

    procs = {
        f"w{k}": _start(cli, "train", "c.yaml", "--run", f"w{k}", "--set", f"seed={k}",
                        env={"SEEDLEDGER_FAILPOINT": "committed@1"} if k in KILLED else None)
        for k in range(WRITERS)
    }
    if db == "postgres":  # a Ray pool of 2 workers (its own local cluster), same run as w0
        procs["ray"] = _start(cli, "train", "c.yaml", "--run", "ray", "--set", "seed=0",
                              "--set", "workers.pool=ray", "--set", "workers.count=2",
                              env={"SEEDLEDGER_RAY_OBJECT_STORE": str(200 * 2**20), "RAY_ADDRESS": ""})
    done = _finish(procs)
    for name, (code, _out, err) in done.items():
        killed = name in {f"w{k}" for k in KILLED}
        assert code == (-9 if killed else 0), f"{name} exited {code}: {err[-2000:]}"
    resumed = _finish({f"w{k}": _start(cli, "resume", f"w{k}") for k in KILLED})
    for name, (code, out, err) in resumed.items():
        assert code == 0, f"resume {name}: {err[-2000:]}"
        assert json.loads(out)["generations_committed"] == [2]
        assert f"note: took over the lease of run '{name}'" in err and "is dead" in err
    finals = {name: json.loads(out)["fingerprint"] for name, (_, out, _) in {**done, **resumed}.items() if out}

    from seedledger.engine.rebuild.sources import load_base_master
    from seedledger.replay.rebuild import verify

    base = load_base_master(tiny_model_dir)
    runs = sorted(finals)
    with Ledger.open(url) as led:
        with led.engine.connect() as conn:  # exactly generations 1 and 2 of every run, once
            rows = conn.execute(sa.text(
                "SELECT r.name, g.idx, count(*) FROM generations g JOIN runs r ON r.id = g.run_id "
                "GROUP BY r.name, g.idx ORDER BY r.name, g.idx")).all()
        assert [tuple(r) for r in rows] == [(n, g, 1) for n in runs for g in (1, 2)]
        for name in runs:
            assert led.check_chain(name)[1] == 2
            assert verify(led, name, None, {k: v.clone() for k, v in base.items()}) == finals[name]
            takeovers = led.events(name, "lease-takeover")
            if name in {f"w{k}" for k in KILLED}:
                (event,) = takeovers
                assert event.payload["reason"].startswith("holder pid") and "dead" in event.payload["reason"]
            else:
                assert takeovers == []
            assert led.get_run(name).status == "finished"
    assert len(set(finals[f"w{k}"] for k in range(WRITERS))) == WRITERS  # eight different runs
    if db == "postgres":
        assert finals["ray"] == finals["w0"]  # Ray workers on PostgreSQL == the local pool
