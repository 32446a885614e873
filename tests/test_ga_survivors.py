"""A GA with several survivors (`ga.survivors`, trainers/ga.py): breeding is a function of
the key; on a toy objective through the real replay code the master *is* the best genome
bit for bit and every other survivor rides the replay state as its offset; a run on `tiny`
with a LoRA adapter records the `paths` rule's mix/noise form, verifies, rebuilds every
genome to what the HF backend evaluated, survives SIGKILL + resume and forks to the same
bits; what it cannot run is refused in one line."""

from __future__ import annotations

import copy
import json
import math
import shutil
from types import SimpleNamespace

import pytest
import torch
import yaml

from seedledger.engine.config import Schedules, validate
from seedledger.engine.rebuild.rebuilding import load_start, ref_master
from seedledger.engine.runtime import session
from seedledger.ledger import Ledger, ReplayStep
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay import paths
from seedledger.replay.adapter import member_adapter, peft_adapter
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.noise import member_key, round_coefficient
from seedledger.replay.rebuild import apply_member, rebuild
from seedledger.replay.update import OptimizerState, apply_step
from seedledger.trainers.adaptation import Hyperparameters
from seedledger.trainers.ga import BREEDING_SLOT, GA, GASpec, GAState, Sharing, breed
from seedledger.trainers.optim import OptimizerSpec
from tests.support.runs import cli, fingerprints

SHAPES = {"a": (6, 5), "b": (10,)}


# ------------------------------------------------------------------------ pure functions


def test_breeding_is_a_pure_function_of_the_key():
    seen = set()
    for child in range(200):
        bred = breed(key=9, child=child, survivors=4, crossover=0.5)
        assert bred == breed(key=9, child=child, survivors=4, crossover=0.5)
        assert math.fsum(bred.values()) == 1.0 and all(0 <= k < 4 for k in bred)
        assert all(w * 4096 == int(w * 4096) and w > 0 for w in bred.values())  # the grid: exact in fp32
        seen.add(len(bred))
    assert seen == {1, 2}, "about half the children cross over"
    assert all(breed(9, c, 4, 0.0).keys() <= set(range(4)) and len(breed(9, c, 4, 0.0)) == 1 for c in range(50))
    assert all(breed(9, c, 1, 1.0) == {0: 1.0} for c in range(50))


def test_members_are_elites_then_children_along_the_offsets():
    spec = GASpec(survivors=3)
    ga = GA(6, spec)
    kept = GAState(kept=3)  # as `observe` leaves it after a generation that kept three survivors
    members, _ = ga.ask(kept, run_key=3, generation=2, sigma=0.5)
    assert [m.sign for m in members] == [0, 0, 0, 1, 1, 1]
    assert [m.paths for m in members[:3]] == [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)]
    key = member_key(3, 2, BREEDING_SLOT)
    for m in members[3:]:  # survivor 0 is the master: no offset; survivor k is offset k − 1
        bred = breed(key, m.index, 3, spec.crossover)
        assert m.paths == (bred.get(1, 0.0), bred.get(2, 0.0))
    first, _ = ga.ask(ga.start(), run_key=3, generation=1, sigma=0.5)  # nothing kept yet: all from the master
    assert [m.sign for m in first] == [0, 1, 1, 1, 1, 1] and all(m.paths == (0.0, 0.0) for m in first)


# ------------------------------------------------------------------------ toy objective, real replay


def _objective(x: dict[str, torch.Tensor]) -> list[float]:
    """Per-sample rewards: minus the squared distance to a target, per coordinate."""
    flat = torch.cat([x[n].double().reshape(-1) for n in SHAPES])
    target = torch.linspace(-1, 1, flat.numel(), dtype=torch.float64)
    return (-(flat - target) ** 2).tolist()


def _toy_run(generations: int, spec: GASpec, population: int = 8, sigma: float = 0.125):
    """The GA through `replay`: members built by `apply_member`, the update by `apply_step`."""
    ga = GA(population, spec, hyperparameters=Hyperparameters(1.0, sigma, Schedules(), generations))  # a constant σ
    policy_state = ga.start()
    master = {n: torch.zeros(s) for n, s in SHAPES.items()}
    state = OptimizerState()
    for g in range(1, generations + 1):
        lr, sig, _ = ga.hyperparameters(policy_state, g)
        members, policy_state = ga.ask(policy_state, run_key=21, generation=g, sigma=sig)
        m = spec.survivors - 1
        rows = {"name": "paths", "move": [0.0] * m, "mix": [[0.0] * m] * m, "noise": [[0.0] * population] * m,
                "shrink": 1.0, "members": [list(mb.paths) for mb in members]}
        genomes = []
        for mb in members:
            x = copy.deepcopy(master)
            step = ReplayStep(run="toy", index=g, keys=[mb.key for mb in members], coefficients=[], sigma=sig,
                              optimizer=rows)
            apply_member(x, step, mb.key, mb.sign, member=mb.index, state=state)
            genomes.append(x)
        per_sample = [_objective(x) for x in genomes]
        rewards = [math.fsum(v) for v in per_sample]
        decision = ga.tell(policy_state, members, rewards, lr=lr, sigma=sig, optimizer=OptimizerSpec(),
                           sample_rewards=per_sample)
        coefs = decision.coefficients
        start = (copy.deepcopy(master), copy.deepcopy(state))
        step = ReplayStep(run="toy", index=g, keys=[mb.key for mb in members], coefficients=coefs, sigma=sig,
                          optimizer=decision.optimizer)
        apply_step(master, state, step)
        record = SimpleNamespace(index=g, sigma=sig, optimizer=step.optimizer, extra=decision.extra)
        policy_state = ga.observe(policy_state, record)
        yield SimpleNamespace(start=start, step=step, members=members, genomes=genomes, rewards=rewards,
                              told=decision.extra["ga"], master=copy.deepcopy(master), state=copy.deepcopy(state),
                              record=record)


@pytest.mark.parametrize("spec", [
    GASpec(survivors=3, crossover=0.5, sharing=Sharing(radius=0.05)),
    GASpec(survivors=3, crossover=0.5, selection="tournament", tournament=4, elitism=False),
], ids=["truncation-shared-elitist", "tournament-no-elites"])
def test_the_master_is_the_best_genome_and_survivors_ride_as_offsets(spec):
    gens = list(_toy_run(12, spec))
    crossed = short = 0
    for gen, following in zip(gens, gens[1:], strict=False):
        survivors = gen.told["survivors"]
        assert len(set(survivors)) == len(survivors) <= 3
        if spec.selection == "truncation":
            assert survivors == sorted(survivors, key=lambda i: (-gen.told["fitness"][i], i))
        # the new master is the best genome, bit for bit
        assert fingerprint(gen.master) == fingerprint(gen.genomes[survivors[0]])
        # survivor k is the master plus its offset (fp32 rounding of one subtraction apart),
        # and next generation's elite k is exactly that
        for k, s in enumerate(survivors[1:], 1):
            along = {n: gen.master[n] + gen.state.buffers[paths.kind(k - 1)][n] for n in SHAPES}
            for n in SHAPES:
                assert torch.allclose(along[n], gen.genomes[s][n], rtol=0, atol=1e-6)
            if spec.elitism:
                assert fingerprint(following.genomes[k]) == fingerprint(along)
        for j in range(len(survivors) - 1, 2):  # a tournament that kept fewer: its offsets are zero
            short += 1
            assert all(not gen.state.buffers[paths.kind(j)][n].any() for n in SHAPES)
        assert all(len(bred) <= 2 and max(k for k, _ in bred) < len(survivors)
                   for bred in following.told["breeding"] if bred)
        assert [m.sign for m in following.members].count(0) == (len(survivors) if spec.elitism else 0)
        crossed += sum(bred is not None and len(bred) == 2 for bred in following.told["breeding"])
    assert crossed > 0, "some children are crossovers of two survivors"
    assert short > 0 or spec.selection == "truncation", "some tournaments repeat a winner"
    first, last = gens[0].rewards, gens[-1].rewards
    assert max(last) > max(first) and sorted(last)[-3] > sorted(first)[-3], "the survivors improve"


def test_a_winning_elite_leaves_the_master_bit_identical_negative_zeros_included():
    spec = GASpec(survivors=2)
    ga = GA(4, spec)
    members, asked = ga.ask(ga.start(), run_key=5, generation=1, sigma=0.125)
    master = {n: torch.full(s, -0.0) for n, s in SHAPES.items()}
    master["a"][0, 0] = 0.5
    before = copy.deepcopy(master)
    rewards = [1.0, 0.0, 0.0, 0.0]  # elite 0 wins
    decision = ga.tell(asked, members, rewards, lr=1.0, sigma=0.125, optimizer=OptimizerSpec())
    coefs = decision.coefficients
    assert coefs == [0.0] * 4 and decision.extra["ga"]["survivors"][0] == 0
    state = OptimizerState()
    apply_step(master, state, ReplayStep(run="toy", index=1, keys=[m.key for m in members], coefficients=coefs,
                                         sigma=0.125, optimizer=decision.optimizer))
    assert fingerprint(master) == fingerprint(before)
    assert all(torch.equal(master[n].view(torch.int32), before[n].view(torch.int32)) for n in SHAPES)


def test_a_recombining_step_drops_paths_it_does_not_keep():
    """An LM-MA-ES parent's paths (or a fork to fewer survivors): the mix form keeps its own m."""
    master = {n: torch.zeros(s) for n, s in SHAPES.items()}
    state = OptimizerState()
    decaying = {"name": "paths", "move": [0.0] * 3, "decay": [0.5] * 3, "gain": [1.0] * 3}
    apply_step(master, state, ReplayStep(run="toy", index=1, keys=[1], coefficients=[0.125], sigma=0.125,
                                         optimizer=decaying))
    assert sorted(state.buffers) == ["path0", "path1", "path2"]
    mixing = {"name": "paths", "move": [1.0], "mix": [[0.0]], "noise": [[0.25]]}
    apply_step(master, state, ReplayStep(run="toy", index=2, keys=[2], coefficients=[0.0], sigma=0.125,
                                         optimizer=mixing))
    assert sorted(state.buffers) == ["path0"]


def test_replay_from_the_records_alone_reaches_the_same_bits_and_the_same_members():
    spec = GASpec(survivors=3, crossover=0.5)
    gens = list(_toy_run(6, spec))
    master, state = {n: torch.zeros(s) for n, s in SHAPES.items()}, OptimizerState()
    for gen in gens:
        apply_step(master, state, gen.step)
    assert fingerprint(master) == fingerprint(gens[-1].master)
    assert all(state.buffers[paths.kind(j)][n].equal(gens[-1].state.buffers[paths.kind(j)][n])
               for j in range(2) for n in SHAPES)
    resumed = GA(8, spec)  # a fresh policy restored from the records asks the same members
    assert resumed.ask(resumed.restore([g.record for g in gens[:3]]), 21, 4, sigma=0.125)[0] == gens[3].members


# ------------------------------------------------------------------------ runs on tiny

CONFIG = {
    "model": "tiny",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 20}]},
    "train": {"kind": "lora", "rank": 4, "target_modules": ["q_proj", "v_proj"]},
    "algorithm": "ga",
    "ga": {"survivors": 3, "crossover": 0.5, "sharing": {"radius": 0.5}},
    "mirrored": False,
    "population": 6,
    "sigma": 0.5,
    "lr": 1.0,
    "generations": 3,
    "batch_size": 2,
    "max_new_tokens": 4,
    "seed": 5,
}


@pytest.mark.parametrize(("change", "says"), [
    ({"train": "lowrank"}, "use train: full or an adapter"),
    ({"backend": "vllm"}, "in-process hf backend"),
    ({"ga": {"survivors": 6}}, "leave no room for children"),
    ({"ga": {"survivors": 3, "parents": 3}}, "the survivors are the parents"),
])
def test_what_survivors_cannot_run_is_refused_in_one_line(change, says):
    with pytest.raises(Exception, match=says) as err:
        validate(CONFIG | change)
    assert "\n" not in str(err.value).strip()


@pytest.fixture(scope="module")
def ga_run(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("ga_survivors")
    (tmp / "ga.yaml").write_text(yaml.safe_dump(CONFIG))
    with Ledger.open(str(tmp / "g.db")) as led:
        session.start(led, str(tmp / "ga.yaml"), "g", [], None)
    return tmp


def test_every_genome_rebuilds_to_what_was_evaluated(ga_run):
    tmp = ga_run
    fps = fingerprints(tmp / "g.db", "g")
    with Ledger.open(str(tmp / "g.db")) as led:
        records = [led.generation("g", g) for g in (1, 2, 3)]
        base_fp = fingerprint(ref_master(led, "g@0")[1])  # the adapter's initial master
        assert all(r.optimizer["name"] == "paths" and len(r.optimizer["mix"]) == 2 for r in records)
        offsets = [b for r in records[1:] for row in r.optimizer["members"] for b in row]
        assert any(b != 0.0 for b in offsets), "children rode offsets"
        assert len(set(fps)) == 3, "pick a seed whose masters move every generation"
        run = led.get_run("g")
        start = load_start("tiny", run.config, run.noise_spec, run.param_selection)
        parents = [base_fp, *fps]
        for g, record in enumerate(records, 1):
            best = record.extra["ga"]["survivors"][0]
            _, member, _, _ = ref_master(led, f"g@{g}#{best}")
            assert fingerprint(member) == fps[g - 1], "the master after g is its best genome, bit for bit"
            _, elite, _, _ = ref_master(led, f"g@{g}#0")
            assert fingerprint(elite) == parents[g - 1], "elite 0 is the master it started from"
        # a child of generation 3 along the offsets: as `rebuild g@3#M` builds it and as the HF backend did
        master, state = rebuild(led, "g", 2, {n: t.clone() for n, t in start.master.items()}, frozen=start.frozen)
        child = next(i for i, row in enumerate(records[2].optimizer["members"]) if any(row) and i >= 3)
        m = records[2].members[child]
        evaluated = member_adapter(start.adapter, master, m.key, round_coefficient(m.sign * records[2].sigma),
                                   records[2].optimizer["members"][child], state)
        _, member, _, _ = ref_master(led, f"g@3#{child}")
    rebuilt = peft_adapter(start.adapter, member)
    assert set(rebuilt) == set(evaluated) and all(rebuilt[n].equal(evaluated[n]) for n in rebuilt)
    assert json.loads(cli("verify", "g", "--json", "--ledger", tmp / "g.db").stdout)["ok"]
    cli("export", "g", "-o", tmp / "g.seeds", "--ledger", tmp / "g.db")
    assert fps[-1] in cli("rebuild", tmp / "g.seeds", "-o", tmp / "from-seeds", "--json").stdout
    proc = cli("export", f"g@3#{child}", "-o", tmp / "m.seeds", "--ledger", tmp / "g.db", check=False)
    assert proc.returncode != 0 and not (tmp / "m.seeds").exists()
    assert "a GA's survivor offsets" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_show_and_diff_name_survivors_and_children(ga_run):
    tmp = ga_run
    with Ledger.open(str(tmp / "g.db")) as led:
        told = led.generation("g", 2).extra["ga"]
    best, child = told["survivors"][0], 5
    shown = json.loads(cli("show", f"g@2#{child}", "--json", "--ledger", tmp / "g.db").stdout)
    assert shown["ga"]["bred"] == told["breeding"][child] and shown["paths"]["terms"]
    same = json.loads(cli("diff", "g@2", f"g@2#{best}", "--json", "--ledger", tmp / "g.db").stdout)
    assert same["total"]["changed"] == 0
    text = cli("show", f"g@2#{best}", "--ledger", tmp / "g.db").stdout
    assert "survivor" in text and "survivor offsets" in text
    generation = cli("show", "g@2", "--ledger", tmp / "g.db").stdout  # per-member rows by shape, not in full
    assert "members=[6×2]" in generation and "noise=[2×6]" in generation


def test_a_fork_with_fewer_survivors_drops_the_worst_and_lmmaes_refuses_the_offsets(ga_run):
    """A fork with fewer survivors drops the worst, and LM-MA-ES refuses to read a GA's
    offsets as its evolution paths. (Resume and same-settings forks replay the offsets:
    tests/test_lifecycle.py[Adapter-ga+survivors].)"""
    tmp = ga_run
    shutil.copy(tmp / "g.db", tmp / "forks.db")
    cli("fork", "g@2", "--run", "two", "--generations", "1", "--set", "ga.survivors=2", "--ledger", tmp / "forks.db")
    with Ledger.open(str(tmp / "forks.db")) as led:
        record = led.generation("two", 3)
        assert [m.sign for m in record.members][:3] == [0, 0, 1] and len(record.optimizer["mix"]) == 1
    assert json.loads(cli("verify", "two", "--json", "--ledger", tmp / "forks.db").stdout)["ok"]
    proc = cli("fork", "g@2", "--run", "lm", "--set", "algorithm=lmmaes", "--set", "ga=null",
               "--ledger", tmp / "forks.db", check=False)
    *notes, error = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and "a GA's survivor offsets" in error
    assert all(line.startswith("note:") for line in notes)
    with Ledger.open(str(tmp / "forks.db")) as led:
        assert not led.has_run("lm") or led.latest_generation("lm") == 2  # the fork point: nothing new


def test_noise_rows_are_checked_against_the_members():
    good = {"name": "paths", "move": [0.0], "mix": [[1.0]], "noise": [[0.5, 0.0]], "shrink": 1.0,
            "members": [[0.0], [1.0]]}
    assert paths.settings(good, 1, 2).noise == ((0.5, 0.0),)
    for bad, says in (({"noise": [[0.5]]}, "2 numbers"), ({"noise": [[0.1, 0.0]]}, "significant bits"),
                      ({"decay": [1.0], "gain": [1.0]}, "either"), ({"mix": [[1.0, 2.0]]}, "1 numbers"),
                      ({"noise": [[0.5, "x"]]}, "not a finite fp32 number"), ({"noise": [[0.5, 0.0]] * 2}, "1 rows"),
                      ({"mix": None}, "1 rows")):
        with pytest.raises(SeedLedgerError, match=says):
            paths.settings(good | bad, 1, 2)
    # a member rebuild checks the whole rule against its generation's members, not just its row
    master = {n: torch.zeros(s) for n, s in SHAPES.items()}
    step = ReplayStep(run="toy", index=1, keys=[1, 2, 3], coefficients=[], sigma=0.125, optimizer=good)
    with pytest.raises(SeedLedgerError, match="3 numbers"):
        apply_member(master, step, 1, 1, member=1, state=OptimizerState())


def test_full_rank_survivors_are_evaluated_one_member_at_a_time(tmp_path, tiny_model_dir):
    """Full-parameter genomes: the HF backend loads each member's weights in turn, its
    offsets added in fp32 one tensor at a time, bit for bit what `rebuild RUN@G#M` builds."""
    from seedledger.engine.runtime.backends.hf import HFBackend

    cfg = CONFIG | {"train": "full", "population": 6, "sigma": 0.05, "ga": {"survivors": 2, "crossover": 0.5},
                    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 12}]},
                    "generations": 2}
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(cfg))
    cli("train", tmp_path / "full.yaml", "--run", "f", "--ledger", tmp_path / "f.db")
    fps = fingerprints(tmp_path / "f.db", "f")
    with Ledger.open(str(tmp_path / "f.db")) as led:
        second = led.generation("f", 2)
        assert second.optimizer["members"][1] == [1.0] and second.members[1].sign == 0  # survivor 1, unmutated
        best = second.extra["ga"]["survivors"][0]
        assert fingerprint(ref_master(led, f"f@2#{best}")[1]) == fps[1]
        run = led.get_run("f")
        start = load_start("tiny", run.config, run.noise_spec, run.param_selection)
        master, state = rebuild(led, "f", 1, {n: t.clone() for n, t in start.master.items()})
        child = next((i for i, m in enumerate(second.members) if m.sign and any(second.optimizer["members"][i])), None)
        assert child is not None, "pick a seed with a child of survivor 1 in generation 2"
        wanted = {1: ref_master(led, "f@2#1")[1], child: ref_master(led, f"f@2#{child}")[1]}
    backend = HFBackend(tiny_model_dir, batch_size=2)
    params = dict(backend.model.named_parameters())
    for index, member in wanted.items():
        m = second.members[index]
        backend.load_member(master, m.key, m.sign, second.sigma, paths=second.optimizer["members"][index], state=state)
        assert all(params[n].data.equal(member[n]) for n in member), f"member {index}"
    assert json.loads(cli("verify", "f", "--json", "--ledger", tmp_path / "f.db").stdout)["ok"]


def test_anchors_of_four_survivors_are_reused(tmp_path, tiny_model_dir):
    """An anchor's size bound counts a GA's offsets (the rule's mix form), so a run with four
    survivors (three paths) replays from its anchor instead of falling back to the base."""
    import warnings

    from seedledger.engine.runtime.dirs import anchors_dir

    cfg = CONFIG | {"train": "full", "population": 8, "sigma": 0.05, "ga": {"survivors": 4, "crossover": 0.5},
                    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 12}]},
                    "generations": 3, "anchor_every": 1}
    (tmp_path / "four.yaml").write_text(yaml.safe_dump(cfg))
    cli("train", tmp_path / "four.yaml", "--run", "f", "--ledger", tmp_path / "f.db")
    fps = fingerprints(tmp_path / "f.db", "f")
    with Ledger.open(str(tmp_path / "f.db")) as led:
        assert led.anchors("f"), "the run wrote anchors"
        run = led.get_run("f")
        start = load_start("tiny", run.config, run.noise_spec, run.param_selection)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            master, _ = rebuild(led, "f", 3, {n: t.clone() for n, t in start.master.items()},
                                anchors_dir=anchors_dir(led))
    assert not [w for w in caught if "falling back" in str(w.message)], [str(w.message) for w in caught]
    assert fingerprint(master) == fps[-1]
