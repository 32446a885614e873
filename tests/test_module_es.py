"""Any torch.nn.Module (issue 34): `seedledger.evolve`, `model: module:...`, `task: gym:` /
`fitness:`, on the engine's own ledger, replay, resume, fork, verify, seed files, rebuild."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
import yaml

import seedledger as sl
from tests.support.runs import cli as seedledger

TOY = '''
import torch

def mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

X = torch.linspace(-1, 1, 32).reshape(8, 4)
Y = torch.sin(X[:, :2] * 3)

def fit(model):
    with torch.no_grad():
        return -float(((model(X) - Y) ** 2).mean())
'''


@pytest.fixture
def toy(tmp_path) -> tuple[str, str]:
    """(model ref, fitness task) naming a module file in tmp_path: what a config stores."""
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    return f"module:{path}:mlp", f"fitness:{path}:fit"



def fingerprints(ledger, run: str) -> list[str]:
    return [r.fingerprint for r in sl.history(run, ledger=ledger)]


def test_an_mlp_evolves_verifies_forks_and_round_trips_a_seed_file(tmp_path, toy):
    model, task = toy
    led = tmp_path / "l.db"
    result = sl.evolve(model, task, population=16, sigma=0.0625, lr=0.125, generations=8, ledger=led, run="a")
    assert result.run.status == "finished" and result.latest_generation == 8
    means = [r.reward_stats()["mean"] for r in sl.history("a", ledger=led)]
    assert means[-1] > means[0]  # it learns
    events = sl.open_ledger(led).events("a", "module")
    assert [p[0] for p in events[0].payload["parameters"]] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert events[0].payload["parameters"][0][1:] == [[8, 4], "float32"]
    assert sl.verify("a", ledger=led)["ok"]

    child = sl.fork("a@4", "b", overrides=["sigma=0.125"], ledger=led, trust_code=True)
    assert child.run.parent == ("a", 4) and child.latest_generation == 8
    assert sl.verify("b", ledger=led)["ok"]
    assert fingerprints(led, "b")[:4] == fingerprints(led, "a")[:4]

    seeds = tmp_path / "a.seeds"
    sl.export("a", seeds, ledger=led)
    assert seeds.stat().st_size < 4096
    with pytest.raises(sl.SeedLedgerError, match="--base module:"):  # the file's factory is not run unasked
        sl.rebuild(seeds, ledger=led)
    report = sl.rebuild_to(seeds, tmp_path / "out", ledger=led, base=model)
    assert report["fingerprint"] == result.fingerprint
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    ledger_weights = sl.rebuild("a", ledger=led)  # from the base kept beside the ledger: no code
    assert all(torch.equal(weights[n], ledger_weights[n]) for n in ledger_weights)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    policy.load_state_dict(weights)


def test_evolve_takes_objects_in_process_and_continues_with_them(tmp_path):
    led = tmp_path / "l.db"
    target = torch.tensor([0.5, -0.25, 1.0])

    def factory():
        return torch.nn.Linear(3, 1)

    def batched(models, seed):
        assert isinstance(seed, int)
        return [-float(((m.weight[0] - target) ** 2).sum()) for m in models]

    first = sl.evolve(factory, batched, batched=True, population=8, sigma=0.0625, lr=0.25, generations=4,
                      ledger=led, run="p", train=2)
    assert first.latest_generation == 2 and first.run.config["task"]["path"].startswith("in-process:")
    rest = sl.evolve(factory, batched, batched=True, ledger=led, run="p")
    assert rest.latest_generation == 4 and rest.run.status == "finished"
    assert sl.verify("p", ledger=led)["ok"]
    with pytest.raises(sl.SeedLedgerError, match="fork it to change them"):
        sl.evolve(factory, batched, batched=True, ledger=led, run="p", sigma=0.5)


def test_resume_after_sigkill_reaches_the_same_fingerprints(tmp_path, toy):
    model, task = toy
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump({"model": model, "task": task, "population": 8, "sigma": 0.0625,
                                      "lr": 0.125, "generations": 4}))
    whole, killed = tmp_path / "whole.db", tmp_path / "killed.db"
    seedledger("train", config, "--run", "t", "--ledger", whole)
    proc = seedledger("train", config, "--run", "t", "--ledger", killed,
                      env=os.environ | {"SEEDLEDGER_FAILPOINT": "committed@2"}, check=False)
    assert proc.returncode == -signal.SIGKILL
    refused = seedledger("resume", "t", "--ledger", killed, check=False)
    assert refused.returncode == 2 and "--trust-code" in refused.stderr and model in refused.stderr
    payload = json.loads(seedledger("resume", "t", "--ledger", killed, "--trust-code", "--json").stdout)
    assert payload["latest_generation"] == 4
    assert fingerprints(killed, "t") == fingerprints(whole, "t")


def test_a_cartpole_run_is_the_same_in_two_processes(tmp_path):
    pytest.importorskip("gymnasium")
    policy = tmp_path / "policy.py"
    policy.write_text("import torch\n\ndef policy():\n    return torch.nn.Sequential(torch.nn.Linear(4, 8), "
                      "torch.nn.Tanh(), torch.nn.Linear(8, 2))\n")
    config = tmp_path / "cartpole.yaml"
    config.write_text(yaml.safe_dump({"model": f"module:{policy}:policy", "task": "gym:CartPole-v1?episodes=2",
                                      "population": 6, "sigma": 0.125, "lr": 0.125, "generations": 2}))
    runs = []
    for name in ("one", "two"):
        led = tmp_path / f"{name}.db"
        seedledger("train", config, "--run", "c", "--ledger", led)
        runs.append([(r.fingerprint, [m.reward for m in r.members]) for r in sl.history("c", ledger=led)])
    assert runs[0] == runs[1]
    assert all(reward >= 8 for _, rewards in runs[0] for reward in rewards)  # CartPole's shortest episodes


def test_stored_module_code_needs_trust(tmp_path, toy):
    model, task = toy
    led = tmp_path / "l.db"
    sl.evolve(model, task, population=4, sigma=0.0625, lr=0.125, generations=1, ledger=led, run="a")
    for attempt in (lambda: sl.resume("a", generations=1, ledger=led),
                    lambda: sl.fork("a@1", "b", ledger=led, generations=1)):
        with pytest.raises(sl.SeedLedgerError, match="runs only with --trust-code") as exc:
            attempt()
        assert model in str(exc.value) and task.removeprefix("fitness:") in str(exc.value)
    assert sl.resume("a", generations=1, ledger=led, trust_code=True).latest_generation == 2


@pytest.mark.parametrize(("returns", "batched", "says"), [
    ("float('nan')", False, "returned nan for member 0; a fitness must be finite"),
    ("'high'", False, "returned str for member 0, not a number"),
    ("1 / 0", False, "raised ZeroDivisionError for member 0: division by zero"),
    ("[1.0]", True, "returned 1 values for 4 models"),
    ("[math.inf] * len(model)", True, "returned inf for member 0"),
])
def test_bad_fitness_returns_are_one_line_naming_the_function(tmp_path, returns, batched, says):
    path = tmp_path / "bad.py"
    path.write_text(f"import math\n\ndef bad(model):\n    return {returns}\n")
    with pytest.raises(sl.SeedLedgerError) as exc:
        sl.evolve(torch.nn.Linear(2, 1), f"fitness:{path}:bad" + ("?batched=true" if batched else ""),
                  population=4, generations=1, ledger=tmp_path / "l.db", run="bad")
    message = str(exc.value)
    assert f"fitness '{path}:bad'" in message and says in message and "\n" not in message


@pytest.mark.parametrize(("config", "says"), [
    ({"model": "module:pkg.mod:f", "task": "arithmetic"}, "scored by task gym:ENV_ID or fitness:"),
    ({"model": "tiny", "task": "gym:CartPole-v1"}, "scores a torch.nn.Module"),
    ({"model": "module:pkg.mod:f", "task": "gym:CartPole-v1", "backend": "hf"}, "backend hf cannot run"),
    ({"model": "module:pkg.mod:f", "task": "gym:CartPole-v1", "kl": {"beta": 0.1}}, "kl: does not apply"),
])
def test_the_config_refuses_what_a_module_run_cannot_do(config, says):
    from seedledger.engine.config import validate

    with pytest.raises(sl.SeedLedgerError, match=says):
        validate(config)


@pytest.mark.ray
def test_a_cartpole_run_on_two_ray_workers_equals_the_local_pool(tmp_path):
    """Workers import the model and build the episodes themselves: the same records as in process."""
    pytest.importorskip("gymnasium")
    ray = pytest.importorskip("ray")
    import logging

    policy = tmp_path / "policy.py"
    policy.write_text("import torch\n\ndef policy():\n    return torch.nn.Sequential(torch.nn.Linear(4, 8), "
                      "torch.nn.Tanh(), torch.nn.Linear(8, 2))\n")
    config = {"model": f"module:{policy}:policy", "task": "gym:CartPole-v1", "population": 4,
              "sigma": 0.125, "lr": 0.125, "generations": 2}
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


@pytest.mark.slow
def test_the_neuroevolution_notebook_runs_top_to_bottom(tmp_path):
    """examples/neuroevolution.ipynb: train, kill, resume, fork, export, rebuild elsewhere."""
    pytest.importorskip("gymnasium")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    root = Path(__file__).resolve().parents[1]
    nb = nbformat.read(root / "examples" / "neuroevolution.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit it without outputs"
    env = {k: v for k, v in os.environ.items() if k != "SEEDLEDGER_DB"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["TMPDIR"] = str(tmp_path)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)
    text = "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                     for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "killed after generation" in text and "True" in text  # verify
    assert "seed file:" in text and "wrote policy" in text and "balanced the pole for" in text


def test_low_rank_noise_moves_only_the_targeted_linears(tmp_path, toy):
    model, task = toy
    led = tmp_path / "l.db"
    lowrank = {"perturbation": {"kind": "lowrank", "rank": 1, "targets": ["0", "2"]}}
    result = sl.evolve(model, task, config=lowrank, population=8, sigma=0.0625, lr=0.125, generations=3,
                       ledger=led, run="lr")
    assert result.run.noise_spec == "lowrank-v1:r=1" and sl.verify("lr", ledger=led)["ok"]
    before, after = sl.rebuild("lr@0", ledger=led), sl.rebuild("lr", ledger=led)
    assert {n: not torch.equal(before[n], after[n]) for n in before} == {
        "0.weight": True, "0.bias": False, "2.weight": True, "2.bias": False}


def test_an_edited_model_factory_is_a_changed_input_on_resume(tmp_path):
    """The factory's source is code the base fingerprint does not pin (its forward): resume
    refuses an edit in one line naming the file, unless the change is accepted."""
    (tmp_path / "net.py").write_text(TOY.split("X = ")[0])  # the factory alone
    (tmp_path / "fit.py").write_text(f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n{TOY}")
    led = tmp_path / "l.db"
    sl.evolve(f"module:{tmp_path / 'net.py'}:mlp", f"fitness:{tmp_path / 'fit.py'}:fit", population=4,
              sigma=0.0625, lr=0.125, generations=1, ledger=led, run="a")
    with (tmp_path / "net.py").open("a") as f:
        f.write("\n# forward changed here\n")
    with pytest.raises(sl.SeedLedgerError, match="net.py") as exc:
        sl.resume("a", generations=1, ledger=led, trust_code=True)
    assert "\n" not in str(exc.value)
    done = sl.resume("a", generations=1, ledger=led, trust_code=True, accept_changed_inputs=True)
    assert done.latest_generation == 2
