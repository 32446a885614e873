"""The Policy base: one typed surface (ask, one tell → Decision, declared hooks), the
algorithms' declarations checked in one place, and one member type from ask to record."""

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from seedledger.engine.config import validate
from seedledger.ledger import MemberRecord
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.cmaes import CMAES, CMAESSpec
from seedledger.trainers.es import ES
from seedledger.trainers.fitness import GenerationState
from seedledger.trainers.member import Member
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.policy import ALGORITHMS, Decision, Policy, make_policy
from seedledger.trainers.policy_base import State, keyed_members

ROOT = Path(__file__).resolve().parents[1]


def test_every_algorithm_is_a_policy_with_its_declarations():
    for name, cls in ALGORITHMS.items():
        assert issubclass(cls, Policy) and cls.name == name
        assert isinstance(make_policy(validate(_valid(name))), cls)
    assert [n for n, cls in ALGORITHMS.items() if cls.needs_state] == ["lmmaes"]


def _valid(name: str) -> dict:
    return {
        "es": {},
        "ga": {"algorithm": "ga", "mirrored": False},
        "cmaes": {"algorithm": "cmaes"},
        "lmmaes": {"algorithm": "lmmaes", "mirrored": False, "train": "lora", "backend": "hf"},
    }[name]


def test_the_loop_and_the_pools_probe_no_policy_with_hasattr():
    for path in [ROOT / "engine/runtime/loop.py", *sorted((ROOT / "engine/runtime/pools").glob("*.py"))]:
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
        assert not [c for c in calls if getattr(c.func, "id", None) == "hasattr"], path


def test_tell_is_one_call_that_returns_the_whole_decision():
    es = ES(4, mirrored=True)
    members, state = es.ask(State(), 1, 1, sigma=0.5)
    momentum = OptimizerSpec(name="momentum")
    decision = es.tell(state, members, [1.0, 0.0, 0.2, 0.7], lr=0.5, sigma=0.5, optimizer=momentum)
    assert isinstance(decision, Decision) and decision.extra == {}
    assert decision.optimizer == momentum.record(0.5)
    cmaes = CMAES(6, CMAESSpec(), hyperparameters=None)
    members, state = cmaes.ask(State(), 2, 3, sigma=0.5)
    told = cmaes.tell(state, members, [0.1, 0.9, 0.4, 0.3, 0.8, 0.0], lr=1.0, sigma=0.5, optimizer=OptimizerSpec())
    assert told.extra == {"cmaes": {"ranking": [1, 4, 2, 3, 0, 5], "mu": 3}}
    assert told.optimizer == OptimizerSpec().record(1.0)


def test_es_and_cmaes_share_one_ask():
    assert "ask" not in vars(ES) and "ask" not in vars(CMAES)
    for mirrored in (True, False):
        expected = keyed_members(9, 4, 6, mirrored)
        es, cmaes = ES(6, mirrored=mirrored), CMAES(6, CMAESSpec(), mirrored=mirrored)
        assert es.ask(State(), 9, 4, sigma=0.5) == (expected, State()) == cmaes.ask(State(), 9, 4, sigma=0.5)


def test_decide_reads_scored_members():
    es = ES(2, mirrored=False)
    asked, state = es.ask(State(), 3, 1, sigma=0.5)
    members = [m.scored(reward=r, components={"x": r}) for m, r in zip(asked, [1.0, 0.0], strict=True)]
    assert es.decide(state, members, lr=1.0, sigma=0.5, optimizer=OptimizerSpec()) == es.tell(
        state, members, [1.0, 0.0], lr=1.0, sigma=0.5, optimizer=OptimizerSpec())


def test_a_member_is_one_type_from_ask_to_its_record():
    asked = Member(3, 77, -1)
    scored = asked.scored(reward=0.5, components={"a": 1.0}, samples=None)
    assert type(scored) is Member and (scored.index, scored.key, scored.sign) == (3, 77, -1)
    assert scored.record(0.25) == MemberRecord(3, 77, -1, 0.5, 0.25, {"a": 1.0}, None)
    with pytest.raises(ValueError, match="not evaluated"):
        asked.record(0.0)


@pytest.mark.parametrize(("changes", "message"), [
    ({"algorithm": "lmmaes", "train": "lora", "mirrored": False, "backend": "vllm"},
     "algorithm lmmaes: members carry path terms only the in-process hf backend builds"),
    ({"algorithm": "lmmaes", "train": "lora", "mirrored": False, "workers": {"pool": "ray"}},
     "algorithm lmmaes: members carry path terms only the in-process hf backend builds"),
    ({"algorithm": "ga", "mirrored": False, "ga": {"survivors": 2}, "perturbation": "lowrank"},
     "ga.survivors: survivors are kept as full-size offsets"),
    ({"kl": {"beta": 0.1}, "backend": "vllm"}, "kl: the KL-to-base penalty needs backend: hf"),
    ({"algorithm": "cmaes", "optimizer": "adam"},
     "algorithm cmaes: its update is applied as is, so optimizer must be sgd"),
    ({"ga": {"parents": 2}}, "ga: settings given but algorithm is not ga"),
    ({"population": 5}, "population must be even when mirrored (got 5)"),
])
def test_one_validator_reads_the_declarations(changes, message):
    with pytest.raises(SeedLedgerError) as refused:
        validate(changes)
    assert str(refused.value).startswith(f"config: {message}")


def test_every_backend_and_pool_the_config_allows_has_a_row():
    from typing import get_args

    from seedledger.engine.config import BACKEND_CAPABILITIES, TrainConfig, Workers
    from seedledger.engine.config_sections import POOL_CAPABILITIES

    assert set(get_args(TrainConfig.model_fields["backend"].annotation)) == set(BACKEND_CAPABILITIES)
    assert set(get_args(Workers.model_fields["pool"].annotation)) == set(POOL_CAPABILITIES)


def _record(index, extra, population=4, batch=2):
    return SimpleNamespace(index=index, extra=extra, population=population, batch_indices=list(range(batch)))


def test_generation_state_settles_kl_and_the_curriculum_beside_their_rewards():
    task = SimpleNamespace(levels=3, level=0, objectives=lambda: {"answer": 1.0})
    cfg = SimpleNamespace(kl=SimpleNamespace(beta=0.5, target=None, horizon=100.0), passk=None, batch_size=2,
                          curriculum=SimpleNamespace(window=1, raise_above=0.5, lower_below=0.1))
    state = GenerationState.restore(cfg, task, [])
    assert state.level == 0
    members = [Member(i, i, 1).scored(reward=1.0, components={"answer": 1.0}, kl=0.2 * i, success=1.0)
               for i in range(2)]
    ranked, objectives, extra = state.settle(1, members)
    assert [m.reward for m in ranked] == [1.0, 1.0 - 0.5 * 0.2]
    assert ranked[1].components == {"answer": 1.0, "task_reward": 1.0, "kl": 0.2}
    assert objectives == {"answer": 1.0, "kl": -0.5}
    assert extra["kl"] == {"beta": 0.5, "mean": pytest.approx(0.1)}
    assert extra["level"] == 0 and extra["success_rate"] == 1.0 and extra["curriculum"]["to_level"] == 1
    resumed = GenerationState.restore(cfg, task, [_record(1, extra)])
    assert resumed.level == state.level == 1 and resumed.kl.beta == state.kl.beta
