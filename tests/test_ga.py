"""The GA (trainers.ga): speciation on a planted population, a toy objective that improves,
and runs on `tiny` whose elites and genomes rebuild to their fingerprints (ledger and
seed file), survive SIGKILL + resume, and fork to the same bits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from seedledger.engine.config import Schedules
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.adaptation import Hyperparameters
from seedledger.trainers.ga import GA, GASpec, GAState, Sharing, select, shared_fitness, species
from seedledger.trainers.member import Member
from seedledger.trainers.optim import OptimizerSpec
from tests.support.runs import cli as _cli
from tests.support.runs import fingerprints as _fingerprints

TINY = {
    "model": "tiny",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 12}]},
    "algorithm": "ga",
    "mirrored": False,
    "population": 4,
    "sigma": 0.05,
    "lr": 1.0,
    "generations": 3,
    "batch_size": 2,
    "max_new_tokens": 4,
    "seed": 7,
}


def _config(tmp_path: Path, **changes) -> Path:
    cfg = TINY | changes
    if cfg["algorithm"] != "ga":
        cfg.pop("ga", None)
    path = tmp_path / f"{cfg['algorithm']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# ------------------------------------------------------------------------ pure functions


def test_speciation_groups_a_planted_population():
    # three behaviours: genomes 0-2 solve the first part of the batch (the best raw reward),
    # genome 3 the second part, genomes 4-5 nothing
    a, b, c = [1, 1, 0.4, 0], [0, 0, 1, 1], [0, 0, 0, 0]
    vectors = [a, a, [1, 1, 0.4, 0.1], b, c, c]
    rewards = [float(np.mean(v)) for v in vectors]
    sharing = Sharing(radius=0.3)
    fitness = shared_fitness(rewards, vectors, sharing)
    groups = species(fitness, vectors, 0.3)
    assert groups[0] == groups[1] == groups[2] != groups[3] != groups[4] == groups[5] != groups[0]
    # without sharing two genomes of the crowded behaviour take both parent slots; with it
    # their fitness is divided by ~3 and the lone other behaviour is selected too
    assert select(rewards, GASpec(parents=2), key=1) == [2, 0]
    assert select(fitness, GASpec(parents=2), key=1)[0] == 3
    assert {p // 3 for p in select(fitness, GASpec(parents=2), key=1)} == {0, 1}


def test_tournament_is_a_pure_function_of_the_key():
    fitness = [0.1, 0.5, 0.3, 0.9, 0.2]
    spec = GASpec(selection="tournament", parents=3, tournament=2)
    assert select(fitness, spec, key=42) == select(fitness, spec, key=42)
    assert select(fitness, GASpec(selection="tournament", parents=1, tournament=50), key=3) == [3]


def test_ga_on_a_toy_objective_improves():
    """No LLM: genomes are vectors, ε(key) a Gaussian keyed by the member key, the master
    moved by the very coefficients `tell` returns."""
    d, sigma = 20, 0.25
    target = np.linspace(-1, 1, d)

    ga = GA(8, GASpec(parents=2, crossover=0.5, sharing=Sharing(radius=0.5)),
            hyperparameters=Hyperparameters(1.0, sigma, Schedules(), 60))
    state = ga.start()
    master = np.zeros(d)

    def eps(key):
        return np.random.default_rng(key).normal(size=d)

    def loss(x):
        return float(np.sum((x - target) ** 2))

    start = loss(master)
    for g in range(1, 61):
        _, s, _ = ga.hyperparameters(state, g)
        members, state = ga.ask(state, run_key=11, generation=g, sigma=s)
        genomes = [master + s * m.sign * eps(m.key) for m in members]
        per_sample = [list(-((x - target) ** 2)) for x in genomes]
        rewards = [float(np.sum(v)) for v in per_sample]
        told = ga.tell(state, members, rewards, lr=1.0, sigma=s, optimizer=OptimizerSpec(), sample_rewards=per_sample)
        coefs = told.coefficients
        master = master + sum(c * eps(m.key) for m, c in zip(members, coefs, strict=True))
    assert loss(master) < 0.2 * start


def test_elite_is_member_zero_with_sign_zero():
    members, _ = GA(4, GASpec()).ask(GAState(), run_key=3, generation=2, sigma=0.5)
    assert [m.sign for m in members] == [0, 1, 1, 1]
    assert GA(4, GASpec(elitism=False)).ask(GAState(), 3, 2, sigma=0.5)[0][0] == Member(0, members[0].key, 1)


def test_config_refuses_what_a_ga_cannot_do(tmp_path):
    from seedledger.engine.config import validate

    with pytest.raises(SeedLedgerError, match="mirrored: false"):
        validate({"algorithm": "ga"})
    with pytest.raises(SeedLedgerError, match="optimizer must be sgd"):
        validate({"algorithm": "ga", "mirrored": False, "optimizer": "adam"})
    proc = _cli("train", str(_config(tmp_path, optimizer="momentum")), "--ledger", str(tmp_path / "x.db"), check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------ runs on tiny


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ga")
    ledger_path = tmp / "ref.db"
    cfg = _config(tmp, ga={"sharing": {"radius": 0.5}, "crossover": 0.5})
    _cli("train", str(cfg), "--run", "ref", "--ledger", str(ledger_path))
    return ledger_path, _fingerprints(ledger_path, "ref"), cfg


def _rebuilt(ledger_path: Path, source: str, out: Path) -> dict:
    return json.loads(_cli("rebuild", source, "-o", str(out), "--force", "--ledger", str(ledger_path), "--json").stdout)


@pytest.mark.slow
def test_elites_and_genomes_rebuild_to_their_fingerprints(reference, tmp_path):
    ledger_path, fps, _ = reference
    with Ledger.open(str(ledger_path)) as led:
        records = [led.generation("ref", g) for g in (1, 2, 3)]
        base_fp = led.get_run("ref").base_fingerprint
    assert all(r.members[0].sign == 0 and "ga" in r.extra for r in records)
    parents = [base_fp, *fps]
    for g, rec in enumerate(records, 1):
        # the elite of generation g is the master it started from
        assert _rebuilt(ledger_path, f"ref@{g}#0", tmp_path / "m")["fingerprint"] == parents[g - 1]
        child = rec.extra["ga"]["child"]
        if len(child) == 1:  # no crossover: the next master *is* the selected genome
            assert _rebuilt(ledger_path, f"ref@{g}#{child[0]}", tmp_path / "m")["fingerprint"] == fps[g - 1]
    # an arbitrary genome: its parent's weights plus its own perturbation, nothing else
    out = _rebuilt(ledger_path, "ref@2#3", tmp_path / "m")
    assert out["parent_fingerprint"] == fps[0] and out["fingerprint"] not in parents
    # the whole run from a seed file alone
    seeds = tmp_path / "ref.seeds"
    _cli("export", "ref@3", "-o", str(seeds), "--ledger", str(ledger_path))
    assert _rebuilt(ledger_path, str(seeds), tmp_path / "s")["fingerprint"] == fps[2]
    assert json.loads(_cli("verify", "ref", "--ledger", str(ledger_path), "--json").stdout)["ok"]


def test_member_refs_in_show_diff_and_export(reference, tmp_path):
    """`show`, `diff` and `export` take a GA's genomes: the elite `RUN@G#0` is `RUN@G-1`, and
    where a generation did not cross over its child `RUN@G#a` is `RUN@G` (show says so, diff
    finds no weight changed, its seed file rebuilds to `RUN@G`'s fingerprint)."""
    from seedledger.engine.cli import audit

    ledger_path, fps, _ = reference
    with Ledger.open(str(ledger_path)) as led:
        records = {g: led.generation("ref", g) for g in (1, 2, 3)}
        base_fp = led.get_run("ref").base_fingerprint
        plain = [g for g, r in records.items() if len(r.extra["ga"]["child"]) == 1]
        assert plain, "seed 7 crosses over in every generation: pick a seed where one does not"
        g = plain[0]
        a = records[g].extra["ga"]["child"][0]
        child, elite = audit.show_member(led, f"ref@{g}#{a}"), audit.show_member(led, "ref@1#0")
        same = audit.diff(led, f"ref@{g}", f"ref@{g}#{a}")
        elites = audit.diff(led, "ref@1#0", "ref@2#0")
    told = records[g].extra["ga"]
    assert child["same_weights_as"] == f"ref@{g}" and child["ga"]["child"] and child["ga"]["parent"]
    assert (child["ga"]["fitness"], child["ga"]["species"]) == (told["fitness"][a], told["species"][a])
    assert elite["same_weights_as"] == "ref@0" and elite["ga"]["elite"] and elite["sign"] == 0
    assert elite["parent_fingerprint"] == base_fp
    assert same["total"]["changed"] == 0 and same["b"]["fingerprint"] == fps[g - 1]
    assert (elites["a"]["fingerprint"], elites["b"]["fingerprint"]) == (base_fp, fps[0])
    for ref, want in ((f"ref@{g}#{a}", fps[g - 1]), ("ref@1#0", base_fp)):
        seeds = tmp_path / "member.seeds"
        _cli("export", ref, "-o", str(seeds), "--force", "--ledger", str(ledger_path))
        assert _rebuilt(ledger_path, str(seeds), tmp_path / "s")["fingerprint"] == want


def test_member_refs_refuse_what_does_not_exist(reference, tmp_path):
    ledger_path, _, _ = reference
    every = ("ref@2#4", "ref@0#1", "ref#1", "ref@2#x", "ref@2#")  # one parser: the rest take two
    calls = [("rebuild", ref, "-o", str(tmp_path / "m")) for ref in every]
    calls += [("show", ref) for ref in every]
    calls += [("diff", "ref@1", ref) for ref in ("ref@2#4", "ref@0#1")]
    calls += [("export", ref, "-o", str(tmp_path / "m.seeds")) for ref in ("ref@2#4", "ref@2#x")]
    for args in calls:
        proc = _cli(*args, "--ledger", str(ledger_path), check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.seeds").exists()


