"""`train`, `resume` and `fork` differ only in the Plan they make (engine.runtime.setup.plans);
one path runs every plan (issue 47 item 5). These check the plans without a model: what each
entry reads and refuses, and that a fork validates its parent's config once."""

from __future__ import annotations

import pytest

from seedledger.engine.runtime.setup import plans
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError


@pytest.fixture
def ledger(tmp_path):
    with Ledger.open(tmp_path / "l.db") as led:
        led.create_run("p", base_model="tiny", noise_spec="v1", run_key=1, config={"model": "tiny"})
        yield led


def test_a_fork_plan_continues_its_parent_and_validates_its_config_once(ledger, monkeypatch):
    seen = []

    def counting(data, what, **kw):
        seen.append(what)
        return validate(data, what, **kw)

    validate = plans.validate
    monkeypatch.setattr(plans, "validate", counting)
    plan = plans.for_fork(ledger, "p@0", "c", [], None, False, False)
    assert seen == ["fork config", "run p config"]  # the child's config, then the parent's once
    assert (plan.session, plan.name, plan.at, plan.run, plan.regroup) == ("fork", "c", 0, None, False)
    assert plan.continues is plan.parent and plan.parent.name == "p"
    assert plans.for_fork(ledger, "p@0", "c", ["population=4"], None, False, False).regroup
    assert not plans.for_fork(ledger, "p@0", "c", ["population=4", "members_per_forward=2"],
                                      None, False, False).regroup
    assert not ledger.has_run("c")  # a plan creates nothing


def test_the_three_plans_say_what_they_continue(ledger):
    start = plans.for_start(ledger, {"model": "tiny"}, "n", [], 3)
    assert (start.session, start.name, start.generations, start.continues) == ("train", "n", 3, None)
    resume = plans.for_resume(ledger, "p", None, True, False, False)
    assert (resume.session, resume.take_over, resume.continues.name) == ("resume", True, "p")
    assert resume.parent is None and resume.run is resume.continues


def test_plan_refusals_keep_their_words(ledger):
    with pytest.raises(SeedLedgerError, match=r"run 'p' exists: `seedledger resume p`"):
        plans.for_start(ledger, {"model": "tiny"}, "p", [], 1)
    with pytest.raises(SeedLedgerError, match="a fork keeps its parent's base model"):
        plans.for_fork(ledger, "p@0", "c", ["model=other"], None, False, False)
    with pytest.raises(SeedLedgerError, match=r"run 'p' exists; pick another --run"):
        plans.for_fork(ledger, "p@0", "p", [], None, False, False)
