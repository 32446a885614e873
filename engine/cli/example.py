"""`seedledger example [NAME]`: the example configs shipped inside the package, so that an
installed seedledger (no repository checkout) can start the README's walkthrough:
`seedledger example quickstart > quickstart.yaml`. They live in engine/configs/ (package
data), the only copy. The data files an example trains on
(engine/configs/data/*.jsonl) print the same way, by file name:
`seedledger example opposites.jsonl > opposites.jsonl` next to `jsonl.yaml`.
"""

from __future__ import annotations

import json
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Annotated

import typer

from seedledger.engine.cli.app import JsonOpt, app, emit
from seedledger.ledger.errors import SeedLedgerError, did_you_mean


def examples() -> dict[str, Traversable]:
    """The shipped configs by name (file stem), sorted."""
    found = [f for f in (files("seedledger.engine") / "configs").iterdir() if f.name.endswith(".yaml")]
    return {f.name.removesuffix(".yaml"): f for f in sorted(found, key=lambda f: f.name)}


def data_files() -> dict[str, Traversable]:
    """The shipped data files by file name (`opposites.jsonl`), sorted."""
    found = [f for f in (files("seedledger.engine") / "configs" / "data").iterdir() if f.name.endswith(".jsonl")]
    return {f.name: f for f in sorted(found, key=lambda f: f.name)}


def example_text(name: str) -> str:
    """The text of example config or data file `name` (SeedLedgerError naming the known
    ones otherwise)."""
    known = {**examples(), **data_files()}
    if name not in known:
        raise SeedLedgerError(
            f"no example config {name!r}{did_you_mean(name, known)}; known: {', '.join(known)}"
        )
    return known[name].read_text(encoding="utf-8")


def _summary(text: str) -> str:
    """An example's first comment line: what it is for."""
    first = text.splitlines()[0] if text else ""
    return first.removeprefix("#").strip() if first.startswith("#") else ""


def _data_summary(text: str) -> str:
    """A data file's row count and its first row's columns."""
    rows = [ln for ln in text.splitlines() if ln.strip()]
    columns = ", ".join(json.loads(rows[0])) if rows else ""
    return f"data: {len(rows)} rows ({columns})"


@app.command()
def example(
    name: Annotated[str | None, typer.Argument(help="Example to print (omit: list them).")] = None,
    as_json: JsonOpt = False,
):
    """Print a shipped example config: `seedledger example quickstart > quickstart.yaml`."""
    if name is None:
        rows = [{"name": n, "summary": _summary(f.read_text(encoding="utf-8"))} for n, f in examples().items()]
        rows += [{"name": n, "summary": _data_summary(f.read_text(encoding="utf-8"))}
                 for n, f in data_files().items()]
        width = max(len(r["name"]) for r in rows)
        human = "\n".join(f"{r['name']:<{width}}  {r['summary']}" for r in rows)
        emit({"examples": rows}, as_json, human)
        return
    text = example_text(name)
    if as_json:
        emit({"name": name, "config": text}, as_json)
    else:
        typer.echo(text, nl=False)
