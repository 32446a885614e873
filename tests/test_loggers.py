"""Tracker mirrors (report_to): each real library in its local/offline mode, read back
with that library's own reader; failures are warned about once and never stop training."""

from __future__ import annotations

import struct
import sys
import warnings
from pathlib import Path

import pytest

from seedledger.engine.runtime.loggers import MultiLogger, make_loggers, normalize
from seedledger.ledger.errors import SeedLedgerError

CONFIG = {
    "population": 4,
    "lr": 0.001,
    "optimizer": {"name": "momentum", "beta": 0.9},
    "report_to": ["tensorboard"],
    "task": "countdown",
}
METRICS = {
    1: {"reward/mean": 0.25, "reward/max": 1.0},
    2: {"reward/mean": 0.5, "reward/max": 1.0},
    3: {"reward/mean": 0.75, "reward/max": 1.0, "skipped": None, "note": "text"},
}


def _log_all(loggers: MultiLogger, gens=(1, 2, 3)) -> None:
    for g in gens:
        loggers.log_generation(g, METRICS[g])


def test_normalize_and_unknown_name():
    assert normalize(None) == [] and normalize("none") == [] and normalize([]) == []
    assert normalize("TensorBoard") == ["tensorboard"]
    assert normalize(["wandb", "mlflow", "wandb"]) == ["wandb", "mlflow"]
    with pytest.raises(SeedLedgerError) as err:
        make_loggers(["tensorboard", "comet"], "r", Path("/nonexistent"), {})
    assert "comet" in str(err.value) and "\n" not in str(err.value)


def test_missing_library_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(SeedLedgerError, match=r"pip install 'seedledger\[wandb\]'"):
        make_loggers(["wandb"], "r", tmp_path, CONFIG)


def test_tensorboard_event_files_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    with make_loggers(["tensorboard"], "demo", tmp_path, CONFIG) as loggers:
        _log_all(loggers)
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard" / "demo"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [
        (1, 0.25),
        (2, 0.5),
        (3, 0.75),
    ]
    assert [e.step for e in acc.Scalars("reward/max")] == [1, 2, 3]
    assert "skipped" not in acc.Tags()["scalars"]
    start = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["optimizer.name"].string_value == "momentum"
    assert start.hparams["population"].number_value == 4
    assert start.hparams["report_to"].string_value == '["tensorboard"]'


# MLflow's SQL store still uses a loader SQLAlchemy 2.1 deprecates; not ours to fix.
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")
def test_mlflow_sqlite_store_read_back_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    with make_loggers(["mlflow"], "demo", tmp_path, CONFIG) as loggers:
        _log_all(loggers, (1, 2))
    with make_loggers(["mlflow"], "demo", tmp_path, CONFIG) as loggers:  # resume
        _log_all(loggers, (3,))

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("seedledger")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "demo" and run.info.status == "FINISHED"
    assert run.data.params["optimizer.beta"] == "0.9" and run.data.params["lr"] == "0.001"
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.5), (3, 0.75)]


def _wandb_records(path: Path):
    """Read a `.wandb` transaction log: a 7-byte header, then LevelDB-log records
    (crc32, length, type) in 32 KiB blocks, each payload a protobuf `Record`."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer too short for a header: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            yield wandb_internal_pb2.Record.FromString(pending)
            pending = b""


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_run_files(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    import json

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with make_loggers(["wandb"], "demo", tmp_path, CONFIG) as loggers:
        _log_all(loggers)
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")

    history, config, kinds = {}, {}, []
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        kinds.append(kind)
        if kind == "history":
            row = {_key(i): json.loads(i.value_json) for i in record.history.item}
            history[row["_step"]] = row
        elif kind == "run":
            assert record.run.display_name == "demo"
            config.update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
    assert sorted(history) == [1, 2, 3], f"history steps {sorted(history)}; records {kinds}"
    assert [history[g]["reward/mean"] for g in (1, 2, 3)] == [0.25, 0.5, 0.75]
    assert "skipped" not in history[3]
    assert config["optimizer"] == {"name": "momentum", "beta": 0.9}


class _Broken:
    def __init__(self) -> None:
        self.calls = self.closes = 0

    def log_generation(self, generation, metrics):
        self.calls += 1
        raise OSError("disk full")

    def close(self):
        self.closes += 1
        raise OSError("still full")


class _Recorder:
    def __init__(self) -> None:
        self.rows, self.closed = [], False

    def log_generation(self, generation, metrics):
        self.rows.append((generation, metrics))

    def close(self):
        self.closed = True


def test_failure_mid_run_warns_once_and_disables():
    broken, ok = _Broken(), _Recorder()
    loggers = MultiLogger({"mlflow": broken, "tensorboard": ok})
    with pytest.warns(RuntimeWarning, match="mlflow logger failed.*disk full") as caught:
        _log_all(loggers)
        loggers.close()
    assert len(caught) == 1 and broken.calls == 1 and broken.closes == 1
    assert [g for g, _ in ok.rows] == [1, 2, 3] and ok.closed
    assert ok.rows[2][1] == {"reward/mean": 0.75, "reward/max": 1.0}


def test_real_tracker_failure_keeps_the_others(tmp_path):
    pytest.importorskip("tensorboard")
    ok = _Recorder()
    loggers = make_loggers(["tensorboard"], "demo", tmp_path, CONFIG)
    loggers.loggers["other"] = ok
    tensorboard = loggers.loggers["tensorboard"]
    tensorboard.writer.add_scalar = _Broken().log_generation  # as if the disk filled up
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _log_all(loggers)
        loggers.close()
    assert [str(w.message).split(" ")[0] for w in caught] == ["tensorboard"]
    assert len(ok.rows) == 3 and ok.closed
    assert tensorboard.writer.file_writer is None  # closed (files released) on failure


def test_start_failure_is_one_line_and_closes_started(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://x")
    with pytest.raises(SeedLedgerError, match="mlflow logger could not start") as err:
        make_loggers(["tensorboard", "mlflow"], "demo", tmp_path, CONFIG)
    assert "\n" not in str(err.value)
