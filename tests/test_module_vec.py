"""Module runs at speed and complete (issue 34): `gym:...?vectorized=true` (members ×
episodes stepped together, one batched forward per step), and `diff` / `evaluate` of module
runs, with `evaluation.every` and `tune`'s held-out objective on the one held-out path
(engine.runtime.scoring.evaluator.held_out_scores)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import seedledger as sl
from tests.support.runs import cli as seedledger

pytest.importorskip("gymnasium")

POLICY = """import torch

def cartpole():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

def pendulum():
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
"""


@pytest.fixture
def policies(tmp_path) -> Path:
    path = tmp_path / "policies.py"
    path.write_text(POLICY)
    return path



def members(obs: int, act: int, count: int) -> list[torch.nn.Module]:
    """`count` different policies of one architecture (as a generation's members are)."""
    torch.manual_seed(1)
    base = torch.nn.Sequential(torch.nn.Linear(obs, 8), torch.nn.Tanh(), torch.nn.Linear(8, act))
    out = [copy.deepcopy(base) for _ in range(count)]
    with torch.no_grad():
        for module in out:
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 0.5)
    return out


def test_vectorized_returns_against_one_at_a_time():
    """CartPole (argmax actions): the same returns bit for bit. Pendulum (continuous): the
    batched matmul rounds the actions differently in the last bits, so returns agree to
    ~1e-8 relative, not bit for bit; each member's return does not depend on which or how
    many members share the forward, so a worker's share or a resume sees the same bits."""
    from seedledger.trainers.tasks.gym_task import GymTask

    rows = [11, 12]
    for env, obs, act in (("CartPole-v1", 4, 2), ("Pendulum-v1", 3, 1)):
        policies = members(obs, act, 5)
        one = GymTask(env, 2, max_steps=60).score(policies, rows, list(range(5)))
        vec = GymTask(env, 2, max_steps=60, vectorized=True)
        together = vec.score(policies, rows, list(range(5)))
        assert together[1:3] == vec.score(policies[1:3], rows, [1, 2])
        assert together == [vec.score([p], rows, [i])[0] for i, p in enumerate(policies)]
        if env == "CartPole-v1":
            assert together == one
        else:
            assert together == pytest.approx(one, rel=1e-6, abs=0)


def test_the_linear_stack_shortcut_gives_vmaps_bits():
    """An nn.Sequential of linears and activations skips vmap's overhead with the very ops
    vmap runs for it; any other module runs under vmap: the same numbers either way."""
    from seedledger.trainers.tasks.stacked_policy import StackedPolicy, linear_stack

    class Wrapped(torch.nn.Module):  # the same layers, but not a plain Sequential: vmap
        def __init__(self, inner: torch.nn.Sequential):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    for act in (torch.nn.Tanh, torch.nn.ReLU, torch.nn.GELU):
        torch.manual_seed(2)
        plain = [torch.nn.Sequential(torch.nn.Linear(5, 16), act(), torch.nn.Linear(16, 7), act(),
                                     torch.nn.Linear(7, 3)) for _ in range(6)]
        wrapped = [Wrapped(m) for m in plain]
        assert linear_stack(plain[0]) is not None and linear_stack(wrapped[0]) is None
        x, owners = torch.randn(9, 5), [0, 1, 2, 3, 4, 5, 5, 2, 0]
        fast, vmapped = StackedPolicy(plain, "t")(x, owners), StackedPolicy(wrapped, "t")(x, owners)
        assert torch.equal(fast, vmapped)


def test_a_vectorized_run_resumes_to_the_bits_of_an_unbroken_one(tmp_path, policies):
    task = "gym:Pendulum-v1?max_steps=40&vectorized=true"
    model = f"module:{policies}:pendulum"
    settings = {"population": 6, "sigma": 0.125, "lr": 0.125, "generations": 4}
    whole = sl.evolve(model, task, **settings, ledger=tmp_path / "whole.db", run="p")
    parts = tmp_path / "parts.db"
    sl.evolve(model, task, **settings, ledger=parts, run="p", train=2)
    resumed = sl.evolve(model, task, ledger=parts, run="p")
    assert resumed.latest_generation == 4 and resumed.fingerprint == whole.fingerprint
    rows = [[m.reward for m in r.members] for r in sl.history("p", ledger=parts)]
    assert rows == [[m.reward for m in r.members] for r in sl.history("p", ledger=tmp_path / "whole.db")]
    with sl.open_ledger(parts) as led:
        assert led.get_run("p").config["task"]["vectorized"] is True  # the mode is the run's


def test_a_vectorized_task_refuses_a_module_vmap_cannot_run(tmp_path):
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.lin(x) if float(x.sum()) > 0 else -self.lin(x)  # data-dependent: not vmappable

    with pytest.raises(sl.SeedLedgerError, match="vectorized=true needs a module that runs under torch.vmap") as exc:
        sl.evolve(Branchy(), "gym:CartPole-v1?vectorized=true", population=4, generations=1,
                  ledger=tmp_path / "l.db", run="b")
    assert "\n" not in str(exc.value)


def test_diff_of_a_module_run_needs_no_code(tmp_path, policies):
    """The base is the generation-0 anchor, as for verify: the factory's file may be gone."""
    led = tmp_path / "l.db"
    model, task = f"module:{policies}:cartpole", "gym:CartPole-v1?max_steps=50&vectorized=true"
    sl.evolve(model, task, population=4, sigma=0.125, lr=0.125, generations=3, ledger=led, run="a")
    sl.fork("a@2", "b", overrides=["sigma=0.25"], ledger=led, trust_code=True)
    policies.unlink()
    out = json.loads(seedledger("diff", "a@1", "b@3", "--ledger", led, "--json").stdout)
    assert out["shared_generations"] == 1 and out["total"]["numel"] == 4 * 8 + 8 + 8 * 2 + 2
    assert {t["tensor"] for t in out["tensors"]} == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert out["total"]["l2"] > 0 and out["b"]["fingerprint"] == sl.history("b", ledger=led)[-1].fingerprint
    from seedledger.engine.cli.weight_diff import diff

    with sl.open_ledger(led) as ledger:
        assert diff(ledger, "a@0", "a@0")["total"]["l2"] == 0.0
        member = diff(ledger, "a@1", "a@2#3")
    assert member["b"]["member"] == 3 and member["total"]["l2"] > 0


def test_evaluate_scores_a_module_run_on_held_out_episodes(tmp_path, policies):
    led = tmp_path / "l.db"
    model = f"module:{policies}:cartpole"
    sl.evolve(model, "gym:CartPole-v1?max_steps=100", population=6, sigma=0.125, lr=0.125, generations=3,
              ledger=led, run="a")
    refused = seedledger("evaluate", "a", "--ledger", led, "--rows", "3", check=False)
    assert refused.returncode == 2 and "--trust-code" in refused.stderr and model in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    out = json.loads(seedledger("evaluate", "a", "--ledger", led, "--rows", "4", "--trust-code", "--json").stdout)
    assert out["against"] == "a@0" and out["rows"] == 4 and len(out["rewards"]) == 4
    assert all(1 <= r <= 100 for r in out["rewards"] + out["against_rewards"])  # one episode's return per row
    assert out["change"]["mean"] == pytest.approx(out["mean"] - out["against_mean"])
    again = sl.evaluate("a@3", rows=2, skip=2, ledger=led, trust_code=True, record=False)
    assert again.rewards == out["rewards"][2:]  # held-out rows are fixed seeds: the same episodes
    with sl.open_ledger(led) as ledger:
        events = ledger.events("a", "evaluation")
    assert len(events) == 1 and events[0].payload["rows"] == 4 and events[0].payload["greedy"] is False
    human = seedledger("evaluate", "a", "--ledger", led, "--rows", "3", "--skip", "1", "--trust-code")
    assert human.stdout.splitlines()[0] == "held-out episode seeds 1..3 (3)"  # not greedy decoding of rows
    assert "scoring a@3 on held-out episode seeds 1..3" in human.stderr


def test_evaluate_a_fitness_run_against_another_run(tmp_path):
    path = tmp_path / "toy.py"
    path.write_text("import torch\n\ndef mlp():\n"
                    "    return torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))\n"
                    "\ndef fit(model, seed):\n    x = torch.tensor([[seed % 7 / 7.0, 1.0]])\n"
                    "    return -float((model(x) - 0.5).abs().sum())\n")
    led = tmp_path / "l.db"
    model, task = f"module:{path}:mlp", f"fitness:{path}:fit"
    sl.evolve(model, task, population=8, sigma=0.1, lr=0.1, generations=3, ledger=led, run="a")
    sl.fork("a@1", "b", overrides=["sigma=0.2"], ledger=led, trust_code=True)
    result = sl.evaluate("b", rows=5, against="a@3", ledger=led, trust_code=True)
    assert (result.run, result.generation, result.against) == ("b", 3, "a@3")
    assert len(set(result.rewards)) > 1  # each row passes its own seed
    with pytest.raises(sl.SeedLedgerError, match="runs only with --trust-code"):
        sl.evaluate("b", rows=2, ledger=led)


TOY = """import torch

def mlp():
    return torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))

def fit(model, seed):
    x = torch.tensor([[seed % 7 / 7.0, 1.0]])
    return -float((model(x) - 0.5).abs().sum())
"""


@pytest.fixture
def toy(tmp_path) -> Path:
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    return path


def test_evaluation_every_scores_a_module_run_beside_training(tmp_path, toy):
    """`evaluation.every` on a module run: RUN@G scored on the task's held-out seeds while it
    trains, recorded as `evaluation` events with the figures `evaluate` gives afterwards."""
    led = tmp_path / "l.db"
    sl.evolve(f"module:{toy}:mlp", f"fitness:{toy}:fit", population=8, sigma=0.1, lr=0.1, generations=3,
              ledger=led, run="a", config={"evaluation": {"every": 2, "rows": 4}})
    with sl.open_ledger(led) as ledger:
        events = [e.payload for e in ledger.events("a", "evaluation")]
    assert [(e["generation"], e["by"], e["rows"], e["greedy"]) for e in events] == [
        (2, "training", 4, False), (3, "training", 4, False)]
    again = sl.evaluate("a@3", rows=4, ledger=led, trust_code=True, record=False)
    assert again.mean == events[-1]["mean"] and again.against_mean == events[-1]["against_mean"]
    assert again.change == events[-1]["change"] and len(set(again.rewards)) > 1


def test_tune_with_a_held_out_objective_on_a_module_run(tmp_path, toy):
    """Two trials of two generations on a tiny MLP `fitness:` run, each reported and scored
    on the task's held-out seeds (engine.runtime.scoring.heldout.HeldOut, as for a language model)."""
    pytest.importorskip("optuna")
    import yaml

    from seedledger.engine.search.tune import tune

    (tmp_path / "toy.yaml").write_text(yaml.safe_dump({
        "model": f"module:{toy}:mlp", "task": f"fitness:{toy}:fit", "population": 4, "sigma": 0.1,
        "lr": 0.1, "generations": 2}))
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({
        "config": "toy.yaml", "study": "s", "trials": 2, "objective": {"rows": 3, "every": 1},
        "sampler": {"name": "tpe", "seed": 11, "startup_trials": 2}, "pruner": {"name": "none"},
        "space": {"lr": {"type": "float", "low": 0.01, "high": 0.5, "log": True}}}))
    led = tmp_path / "l.db"
    with sl.open_ledger(led, create=True) as ledger:
        trials = tune(ledger, study)["trials"]
        trained = [ledger.latest_generation(t["run"]) for t in trials]
        held = sl.evaluate("s-t001", rows=3, ledger=ledger, trust_code=True, record=False)
    assert [t["state"] for t in trials] == ["complete", "complete"] and trained == [2, 2], trials
    assert trials[0]["params"] != trials[1]["params"] and all(isinstance(t["value"], float) for t in trials)
    assert trials[1]["value"] == held.mean  # the objective is the held-out mean `evaluate` gives


@pytest.mark.ray
def test_a_vectorized_run_on_two_ray_workers_equals_the_local_pool(tmp_path, policies):
    """Each worker steps its own share of the members together: the same bits as one process."""
    ray = pytest.importorskip("ray")
    import logging

    config = {"model": f"module:{policies}:pendulum", "task": "gym:Pendulum-v1?max_steps=30&vectorized=true",
              "population": 6, "sigma": 0.125, "lr": 0.125, "generations": 2}
    local = sl.train(config, run="c", ledger=tmp_path / "local.db")
    owned = not ray.is_initialized()
    if owned:
        ray.init(address="local", num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False,
                 logging_level=logging.WARNING)
    try:
        remote = sl.train(config | {"workers": {"pool": "ray", "count": 2}}, run="c", ledger=tmp_path / "ray.db")
    finally:
        if owned:
            ray.shutdown()

    def rows(result):
        return [(r.fingerprint, [m.reward for m in r.members]) for r in result.records]

    assert rows(remote) == rows(local) and remote.fingerprint == local.fingerprint
