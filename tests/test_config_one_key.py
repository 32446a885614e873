"""One key names a run's kind (issue 47 item 2): `train:` takes every kind, `perturbation:`
(its older name, for the kinds on the model's own weights) still reads. A run stores only
`train:`; a run stored with both keys is never rewritten (its digest covers its config),
and verifies, resumes, forks, exports and rebuilds to the same bits as one stored with one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from seedledger.engine.config import load_config, validate
from seedledger.engine.config_kinds import LoraTrain, LowRank, QuantScalesTrain, one_key
from seedledger.engine.config_paths import absolute_refs
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from tests.support.runs import fingerprints, rebuilt_from_ledger_and_seed_file

BASE = {"model": "tiny", "task": "arithmetic"}
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("stored", "kind"), [
    ({"perturbation": "full", "train": "full"}, "full"),
    ({"perturbation": {"kind": "lowrank", "rank": 4, "targets": ["q_proj"]}, "train": "full"}, LowRank),
    ({"perturbation": "full", "train": {"kind": "lora", "rank": 4}}, LoraTrain),
    ({"perturbation": "full", "train": {"kind": "quant_scales", "targets": ["q_proj"]}}, QuantScalesTrain),
    ({"perturbation": "lowrank"}, LowRank),
    ({"perturbation": {"name": "full", "rank": 4}}, LowRank),  # `--set perturbation.rank=4` on a full run
])
def test_the_older_forms_read_as_the_one_key(stored, kind):
    cfg = validate({**BASE, **stored})
    assert cfg.train == "full" if kind == "full" else type(cfg.train) is kind
    dumped = cfg.model_dump(mode="json")
    assert "perturbation" not in dumped and validate(dumped) == cfg
    assert "perturbation" not in one_key({**BASE, **stored})


def test_a_config_of_the_older_key_trains_what_the_one_key_trains():
    older = validate({**BASE, "perturbation": {"kind": "lowrank", "rank": 4}})
    assert older == validate({**BASE, "train": {"kind": "lowrank", "rank": 4}})
    assert older.perturbation_spec() == LowRank(rank=4).perturbation_kind()


@pytest.mark.parametrize(("sets", "want"), [
    (["perturbation=lowrank"], ("lowrank", 1)),
    (["perturbation.rank=4"], ("lowrank", 4)),  # settings given to `full` asked for low-rank
    (["train.rank=8"], ("lora", 8)),  # and under `train:` for an adapter, as before
    (["train={rank: 8}"], ("lora", 8)),
    (["train=lowrank", "perturbation=full"], ("full", None)),  # the older key switches the kind
    (["train=lowrank", "perturbation.rank=16"], ("lowrank", 16)),
    (["perturbation=lowrank", "train.rank=16"], ("lowrank", 16)),
    (["train=lora", "perturbation=full"], ("lora", None)),  # what an adapter run stored beside it
    (["train=lowrank", "perturbation=full", "train.kind=lora", "train.rank=8"], ("lora", 8)),  # benchmarks/lora_bench
])
def test_overrides_of_either_key(sets, want):
    train = load_config(None, sets).train
    kind, rank = want
    assert (train if train == "full" else train.kind) == kind
    assert rank is None or train.rank == rank


@pytest.mark.parametrize(("data", "why"), [
    ({"train": "lora", "perturbation": "lowrank"}, "train: lora and perturbation: lowrank both name the run's kind"),
    ({"train": "lowrank", "perturbation": "full"}, "train: lowrank and perturbation: full both name the run's kind"),
    ({"perturbation": "lora"}, "perturbation: 'lora' is not one of full, lowrank: it is the older name of `train`"),
    ({"train": "lowrank", "base_quantization": "int8"}, "only an adapter's frozen base can be quantized"),
    ({"train": {"kind": "lowrank", "rnk": 4}}, "train.rnk: unknown key (did you mean 'rank'?)"),
    ({"train": {"rnk": 4}}, "train.rnk: unknown key (did you mean 'rank'?)"),  # an adapter's, as before
])
def test_what_one_key_refuses_names_the_key(data, why):
    with pytest.raises(SeedLedgerError) as info:
        validate({**BASE, **data})
    assert why in str(info.value) and "\n" not in str(info.value)


def test_a_module_run_trains_its_own_weights_only():
    module = {"model": "module:pkg.mod:f", "task": "gym:CartPole-v1"}
    assert validate({**module, "perturbation": "lowrank"}).train.kind == "lowrank"
    with pytest.raises(SeedLedgerError, match="train: lora does not apply to a torch.nn.Module run"):
        validate({**module, "train": "lora"})


def test_an_adapter_directory_is_made_absolute_under_either_form(tmp_path):
    got = absolute_refs({"perturbation": "full", "train": {"kind": "lora", "init": "sft"}}, tmp_path)
    assert got["train"]["init"] == str(tmp_path / "sft") and "perturbation" not in got


def test_the_reference_names_the_older_key():
    text = (ROOT / "docs" / "config-reference.md").read_text()
    assert "`perturbation` (`full`, `lowrank`)\nis its older name" in text


LOWRANK = {**BASE, "train": {"kind": "lowrank", "rank": 4}, "population": 4, "members_per_forward": 4,
           "sigma": 0.05, "lr": 0.05, "generations": 2, "batch_size": 2, "max_new_tokens": 4, "seed": 3}


def _older(config: dict) -> dict:
    """A config as runs stored it before one key: both keys, the kind under `perturbation:`."""
    return {**config, "perturbation": config["train"], "train": "full"}


@pytest.mark.slow
def test_a_run_stored_with_both_keys_replays_to_the_same_bits(tmp_path, monkeypatch):
    """`older` stores the config as runs stored it before (both keys); `one` the same run
    as a run stores it now. Same base, settings and seed: the same fingerprints, and the
    older run verifies, resumes, forks (with the older key's `--set`), exports and rebuilds."""
    from seedledger.engine.rebuild.rebuilding import verify_ref
    from seedledger.engine.runtime import session
    from seedledger.engine.runtime.setup import plans
    from seedledger.engine.search import tunecheck

    ledger_path = tmp_path / "l.db"
    with Ledger.open(str(ledger_path)) as led:
        session.start(led, dict(LOWRANK), "one", [], None)
        made = plans.run_spec
        monkeypatch.setattr(plans, "run_spec", lambda *a: replace(made(*a), config=_older(made(*a).config)))
        session.start(led, dict(LOWRANK), "older", [], None)
        monkeypatch.undo()
        stored = led.get_run("older").config
        assert stored["train"] == "full" and stored["perturbation"]["kind"] == "lowrank"
        assert "perturbation" not in led.get_run("one").config
        assert fingerprints(ledger_path, "older") == fingerprints(ledger_path, "one")
        assert verify_ref(led, "older")["fingerprint"] == fingerprints(ledger_path, "one")[-1]
        tunecheck.check_config(led, "older", validate(LOWRANK), trust_code=False)  # a trial's stored config
        assert session.resume(led, "older", 1).fingerprint == session.resume(led, "one", 1).fingerprint
        assert led.get_run("older").config == stored  # never rewritten
        child = session.fork(led, "older@2", "full", ["perturbation=full"], 1)
        assert led.get_run("full").config["train"] == "full" and "perturbation" not in led.get_run("full").config
        assert verify_ref(led, "full")["fingerprint"] == child.fingerprint
        with pytest.raises(SeedLedgerError):
            session.fork(led, "older@2", "bad", ["train=lora"], 1)
    from_ledger, from_seeds = rebuilt_from_ledger_and_seed_file("older@3", ledger_path, tmp_path)
    assert from_ledger["fingerprint"] == from_seeds["fingerprint"] == fingerprints(ledger_path, "one")[-1]


def test_a_trial_stored_before_a_key_existed_still_matches_its_study(tmp_path, monkeypatch):
    """A key added since a study's trials were stored (here `sampling.kv_cache`) reads at its
    default, as a resume trains it, so the study goes on; a value the study would not make
    is still refused."""
    from seedledger.engine.runtime import session
    from seedledger.engine.runtime.setup import plans
    from seedledger.engine.search import tunecheck

    made = plans.run_spec

    def before_the_key(*args):
        spec = made(*args)
        sampling = {k: v for k, v in spec.config["sampling"].items() if k != "kv_cache"}
        return replace(spec, config={**spec.config, "sampling": sampling})

    with Ledger.open(str(tmp_path / "l.db")) as led:
        monkeypatch.setattr(plans, "run_spec", before_the_key)
        session.start(led, dict(LOWRANK), "older", [], 0)
        session.start(led, {**LOWRANK, "lr": 0.06}, "planted", [], 0)
        monkeypatch.undo()
        assert "kv_cache" not in led.get_run("older").config["sampling"]
        tunecheck.check_config(led, "older", validate(LOWRANK), trust_code=False)
        with pytest.raises(tunecheck.ForeignTrial, match="lr is 0.06"):
            tunecheck.check_config(led, "planted", validate(LOWRANK), trust_code=False)
