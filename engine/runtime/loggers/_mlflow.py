"""MLflow mirror. Tracking URI: `$MLFLOW_TRACKING_URI`, else a SQLite store at
`log_dir/mlflow.db` (MLflow 3 refuses the old `./mlruns` file store by default).
A resumed run continues the MLflow run tagged with the same seedledger run name."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from ._flatten import flatten

RUN_TAG = "seedledger.run"
MAX_PARAM_LEN = 6000  # MLflow's limit for a param value
BATCH = 100  # MLflow's limit for params per log_batch


def tracking_uri(log_dir: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{log_dir.resolve()}/mlflow.db"


class MLflowLogger:
    def __init__(self, run_name: str, log_dir: Path, config: dict[str, Any]) -> None:
        self.client = MlflowClient(tracking_uri=tracking_uri(log_dir))
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "seedledger")
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
        previous = (
            self.client.search_runs(
                [exp_id], filter_string=f"tags.`{RUN_TAG}` = '{run_name}'", max_results=1
            )
            if "'" not in run_name
            else []
        )
        if previous:
            self.run_id = previous[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return  # params were logged when the run started; MLflow forbids changing them
        run = self.client.create_run(exp_id, run_name=run_name, tags={RUN_TAG: run_name})
        self.run_id = run.info.run_id
        params = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in flatten(config).items()]
        for i in range(0, len(params), BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + BATCH])
        self.client.log_batch(self.run_id, tags=[RunTag("seedledger.mirror", "true")])

    def log_generation(self, generation: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, generation) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
