"""Audit views on a hand-made ledger (no model): JSON shapes, lineage, NaN rewards, errors."""

from __future__ import annotations

import json

import pytest

from seedledger.engine.cli import audit, audit_render
from seedledger.ledger import GenerationRecord, Ledger, MemberRecord
from seedledger.ledger.errors import RunNotFound, SeedLedgerError


def _record(g: int, rewards: list[float], lr: float = 0.01) -> GenerationRecord:
    members = [
        MemberRecord(index=i, key=(g << 32) + i // 2, sign=1 if i % 2 == 0 else -1, reward=r,
                     coefficient=0.5 * (i + 1), components={"task": r, "length": None},
                     samples=[{"row": 3, "completion": f"out {g}.{i}", "reward": r}])
        for i, r in enumerate(rewards)
    ]
    return GenerationRecord(index=g, lr=lr, sigma=1e-3, population=len(members),
                            optimizer={"name": "sgd"}, schedule_step=g, batch_indices=[3, 1],
                            members=members, fingerprint=f"{g:032x}",
                            timings={"evaluate": 1.5, "load_member": 9.0, "update": 0.5})


def _run(led: Ledger, name: str, parent=None):
    return led.create_run(name=name, base_model="tiny", base_revision=None, base_fingerprint="0" * 32,
                          noise_spec="v1", dtype_policy="fp32", param_selection="all",
                          config={}, seed=0, run_key=1, parent=parent)


@pytest.fixture
def led(tmp_path):
    with Ledger.open(tmp_path / "audit.db") as led:
        _run(led, "root")
        led.commit_generation("root", _record(1, [0.0, 1.0, 0.5, 0.5]))
        led.commit_generation("root", _record(2, [1.0, 1.0, 0.0, 1.0]))
        _run(led, "kid", parent=("root", 1))
        led.commit_generation("kid", _record(2, [float("nan")] * 2, lr=0.02))
        _run(led, "grandkid", parent=("kid", 2))
        _run(led, "other")
        yield led


def test_list_runs_and_graph(led):
    rows = {r["name"]: r for r in audit.list_runs(led)}
    assert rows["root"]["best_reward"] == pytest.approx(0.75) and rows["root"]["best_generation"] == 2
    assert rows["kid"]["parent"] == "root@1" and rows["kid"]["generations"] == 2
    assert rows["kid"]["best_reward"] is None  # NaN rewards are unknown, not a maximum
    assert rows["grandkid"]["own_generations"] == 0 and rows["other"]["generations"] == 0
    roots = audit.fork_graph(led)
    assert [r["name"] for r in roots] == ["root", "other"]
    (kid,) = roots[0]["children"]
    assert (kid["name"], kid["forked_at"], kid["children"][0]["name"]) == ("kid", 1, "grandkid")
    json.dumps([rows, roots], allow_nan=False)


def test_run_log_spans_the_lineage(led):
    log = audit.run_log(led, "kid")
    assert [(g["generation"], g["run"]) for g in log["generations"]] == [(1, "root"), (2, "kid")]
    first, second = log["generations"]
    assert first["seconds"] == 2.0 and first["reward_max"] == 1.0 and second["reward_mean"] is None
    assert any(e["kind"] == "fork" for e in log["events"])
    json.dumps(log, allow_nan=False)
    with pytest.raises(RunNotFound):
        audit.run_log(led, "ghost")


def test_show_generation(led):
    shown = audit.show_generation(led, "kid@1", samples_member=2)
    assert shown["recorded_in"] == "root" and shown["hyperparameters"]["lr"] == 0.01
    # keys are 16-digit hex strings, as the tables print them (JSON numbers lose 64-bit precision)
    keys = [(1 << 32), (1 << 32), (1 << 32) + 1, (1 << 32) + 1]
    assert [m["key"] for m in shown["members"]] == [f"{k:016x}" for k in keys]
    assert [("samples" in m) for m in shown["members"]] == [False, False, True, False]
    assert shown["members"][0]["components"] == {"task": 0.0, "length": None}
    everyone = audit.show_generation(led, "kid", samples_member="all")
    assert everyone["generation"] == 2 and all(m["reward"] is None for m in everyone["members"])
    json.dumps([shown, everyone], allow_nan=False)
    with pytest.raises(SeedLedgerError, match="members 0..3"):
        audit.show_generation(led, "root@1", samples_member=9)
    with pytest.raises(SeedLedgerError, match="base model"):
        audit.show_generation(led, "root@0")
    with pytest.raises(SeedLedgerError, match="root@2"):
        audit.show_generation(led, "root@7")


def test_renderers_do_not_crash(led):
    from rich.console import Console

    console = Console(record=True, width=100)
    console.print(audit_render.runs_table(audit.list_runs(led)))
    console.print(audit_render.run_log_view(audit.run_log(led, "grandkid")))
    console.print(audit_render.graph_view(audit.fork_graph(led)))
    console.print(audit_render.show_view(audit.show_generation(led, "kid@2", "all")))
    fake = {"a": {"run": "root", "generation": 1}, "b": {"run": "kid", "generation": 2},
            "shared_generations": 1,
            "tensors": [{"tensor": "w", "shape": [2, 2], "numel": 4, "l2": 0.5, "max_abs": 0.4, "changed": 2}],
            "total": {"l2": 0.5, "max_abs": 0.4, "changed": 2, "numel": 4, "tensors": 1}}
    console.print(audit_render.diff_view(fake, top=0))
    text = console.export_text()
    assert "@1 → kid" in text and "grandkid" in text and "out 2.1" in text and "1 more" in text
