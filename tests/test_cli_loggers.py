"""`report_to` end to end: `seedledger train` on `tiny` mirrors every generation to
TensorBoard and MLflow, under `logs/` beside the ledger; each is read back with the
library's own reader and agrees with the ledger."""

from __future__ import annotations

import pytest
from test_cli_walkthrough import Cli

from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow

CONFIG = tiny_config(sigma=0.05, report_to=["tensorboard", "mlflow"])


# MLflow's SQL store still uses a loader SQLAlchemy 2.1 deprecates; not ours to fix.
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")
def test_train_mirrors_both_generations_to_tensorboard_and_mlflow(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing import event_accumulator

    cli = Cli(tmp_path)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        cli.env.pop(name, None)
    (tmp_path / "c.yaml").write_text(CONFIG)
    assert cli.json("train", "c.yaml", "--run", "r")["generations_committed"] == [1, 2]
    ledger = {g["generation"]: g for g in cli.json("log", "r")["generations"]}

    acc = event_accumulator.EventAccumulator(str(tmp_path / "logs" / "tensorboard" / "r"))
    acc.Reload()
    means = [(e.step, e.value) for e in acc.Scalars("reward/mean")]
    assert [s for s, _ in means] == [1, 2]
    for step, value in means:
        assert value == pytest.approx(ledger[step]["reward_mean"], rel=1e-6, abs=1e-7)
    assert [e.step for e in acc.Scalars("sigma")] == [1, 2]

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/logs/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("seedledger").experiment_id])
    assert run.info.run_name == "r" and run.info.status == "FINISHED"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward/mean"))
    assert [s for s, _ in history] == [1, 2]
    assert [v for _, v in history] == pytest.approx([ledger[1]["reward_mean"], ledger[2]["reward_mean"]])
