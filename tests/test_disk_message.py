"""Issue 31 item 8: with the disk holding a ledger full, SQLite's "disk I/O error" on
`verify --quick` is named for what it is (disk space), in one line. A real size-limited
tmpfs (root only; skipped with the reason elsewhere)."""

from __future__ import annotations

import shutil

from test_cli_walkthrough import Cli
from test_disk_full import _fill, small_fs  # noqa: F401  (fixture)

from tests.support.configs import tiny_config


def test_verify_on_a_full_disk_names_disk_space(tmp_path, small_fs):  # noqa: F811
    (tmp_path / "c.yaml").write_text(tiny_config(generations=1, sigma=2**-10))
    Cli(tmp_path).json("train", "c.yaml", "--run", "r")
    fs = small_fs("4m")
    shutil.copy(tmp_path / "ledger.db", fs / "ledger.db")  # checkpointed on close: no WAL to copy
    _fill(fs / "filler")
    cli = Cli(tmp_path)
    cli.env["SEEDLEDGER_DB"] = str(fs / "ledger.db")
    line = cli.bad("verify", "r", "--quick")
    assert "no space left on the disk" in line, line
