"""The run lifecycle contract, for every perturbation kind × algorithm the config accepts
(tests/support/lifecycle.py): a run verifies by replay from its base; stopped after an
anchored generation and resumed in a new session, it reaches the uninterrupted run's
fingerprints bit for bit; a fork with the same settings replays the parent's later
generations; its seed file rebuilds to the ledger's fingerprint.

What a stop leaves behind (a held writer lease, a half-written generation or anchor, a
killed Ray worker) is the session's mechanism, the same for every kind: real SIGKILLs test it
once per mechanism (tests/test_training.py: commit, update, anchor; tests/test_ray_pool.py:
a Ray worker). Here a stop is the end of a session, so each case proves what is its own:
that its state (residuals, moments, evolution paths, survivors) is rebuilt from the ledger
and the anchors alone.
"""

from __future__ import annotations

import pytest

import seedledger as sl
from seedledger.engine.runtime import session
from seedledger.ledger import Ledger
from seedledger.replay.kinds import KINDS
from seedledger.trainers.policy import ALGORITHMS
from tests.support.lifecycle import ALGORITHM_SETTINGS, KIND_SETTINGS, Case, cases
from tests.support.runs import fingerprints

pytestmark = pytest.mark.slow  # make test-quick leaves it to make test

CASES, REFUSED = cases()


def test_every_registered_kind_and_algorithm_has_settings_and_runs_somewhere():
    assert {kind.__name__ for kind in KINDS} == set(KIND_SETTINGS), "a kind without lifecycle settings"
    assert set(ALGORITHMS) == {name.partition("+")[0] for name in ALGORITHM_SETTINGS}
    assert {c.kind for c in CASES} == set(KIND_SETTINGS), f"a kind the config accepts with no algorithm: {REFUSED}"
    assert {c.algorithm.partition("+")[0] for c in CASES} == set(ALGORITHMS), REFUSED


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c.id)
def reference(request, tmp_path_factory) -> tuple[Case, str, list[str]]:
    """The case's three generations, uninterrupted: (case, ledger path, fingerprints)."""
    case: Case = request.param
    path = str(tmp_path_factory.mktemp(case.id.replace("+", "_")) / "ref.db")
    with Ledger.open(path) as led:
        session.start(led, case.config, "ref", [], None)
    return case, path, fingerprints(path, "ref")


def test_verify_replays_every_generation(reference):
    case, path, fps = reference
    assert len(fps) == case.config["generations"]
    report = sl.verify("ref", ledger=path)
    assert report["ok"] and report["fingerprint"] == fps[-1], report


def test_a_new_session_resumes_from_the_anchor_to_the_same_bits(reference, tmp_path):
    case, _, fps = reference
    path = str(tmp_path / "stopped.db")
    with Ledger.open(path) as led:
        session.start(led, case.config, "r", [], 2)  # the anchor at 2 holds the case's state
        assert [a.generation for a in led.anchors("r")] == [2]
    with Ledger.open(path) as led:
        session.resume(led, "r", None)
    assert fingerprints(path, "r") == fps


def test_a_fork_with_the_same_settings_replays_the_parent(reference, tmp_path):
    case, ref_path, fps = reference
    path = tmp_path / "fork.db"
    path.write_bytes(open(ref_path, "rb").read())
    with Ledger.open(str(path)) as led:
        result = session.fork(led, "ref@1", "kid", [], 2)
    assert [r.fingerprint for r in result.records] == fps[1:]


def test_the_seed_file_rebuilds_to_the_ledgers_fingerprint(reference, tmp_path):
    from seedledger.replay.fingerprint import fingerprint

    _, path, fps = reference
    sl.export("ref", tmp_path / "ref.seeds", ledger=path)
    master = sl.rebuild(tmp_path / "ref.seeds", base="tiny")
    assert fingerprint(master) == fps[-1]
