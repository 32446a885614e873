"""Config validation: defaults that run, overrides, one-line errors naming the field."""

import pytest

from engine.config import load_config
from ledger.errors import SeedLedgerError


def test_defaults_validate():
    cfg = load_config(None)
    assert cfg.model == "smollm2-135m-instruct"
    assert cfg.optimizer.name == "sgd" and cfg.mirrored and cfg.population % 2 == 0


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("population: 4\noptimizer:\n  name: momentum\n  beta: 0.8\nschedule:\n  lr: cosine\n")
    cfg = load_config(path, ["optimizer.dampening=0.5", "lr=1e-3", "report_to=[tensorboard]"])
    assert cfg.population == 4
    assert (cfg.optimizer.name, cfg.optimizer.beta, cfg.optimizer.dampening) == ("momentum", 0.8, 0.5)
    assert cfg.schedule.lr.name == "cosine"
    assert cfg.lr == 1e-3 and cfg.report_to == ["tensorboard"]
    assert load_config(None, ["optimizer=adam"]).optimizer.name == "adam"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["populaton=8"], "populaton: unknown key"),
        (["population=3"], "even"),
        (["sigma=-1"], "sigma: Input should be greater than 0"),
        (["optimizer.name=lion"], "optimizer.name"),
        (["backend=tensorrt"], "backend"),
        (["workers.count=0"], "workers.count"),
        (["noequals"], "key=value"),
    ],
)
def test_bad_values_name_the_field(overrides, message):
    with pytest.raises(SeedLedgerError, match=message.replace(".", r"\.")) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)


def test_bad_files(tmp_path):
    with pytest.raises(SeedLedgerError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("population: [1, 2\n")
    with pytest.raises(SeedLedgerError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(SeedLedgerError, match="mapping"):
        load_config(listy)
