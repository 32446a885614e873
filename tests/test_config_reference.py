"""The configuration reference (docs/hooks/config_reference.py) is rendered from the schema:
every top-level key of TrainConfig and every key of every section it holds has a row, and
each row's default reads back (as YAML) as the value the schema gives when the key is left
out. So a new field, or a changed default, shows up in the docs by itself."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, Field

from seedledger.engine.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("config_reference", ROOT / "docs" / "hooks" / "config_reference.py")
reference = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = reference  # a dataclass needs its module registered
spec.loader.exec_module(reference)


def rows(markdown: str) -> dict[str, list[str]]:
    """{dotted key: [type, default, bounds, meaning]} from the rendered tables."""
    found = {}
    for line in markdown.splitlines():
        match = re.match(r"^\| `([^`]+)` \| (.*) \|$", line)
        if match:
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", match.group(2))]
            assert match.group(1) not in found, f"key {match.group(1)} listed twice"
            found[match.group(1)] = cells
    return found


def expected(model: type[BaseModel], prefix: str = "", defaults: BaseModel | None = None) -> dict[str, object]:
    """{dotted key: default} walked here independently of the hook: a nested model's keys
    take the parent's default instance where it has one."""
    keys: dict[str, object] = {}
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        value = getattr(defaults, name) if defaults is not None else field.get_default(call_default_factory=True)
        keys[key] = value
        nested = reference.models_in(field.annotation)
        for sub in nested:
            kinds = get_args(sub.model_fields["kind"].annotation) if "kind" in sub.model_fields else ()
            if len(nested) == 1:
                path = key
            else:
                path = f"{key} (kind: {' | '.join(kinds)})" if kinds else f"{key} ({sub.__name__})"
            keys |= expected(sub, f"{path}.", value if isinstance(value, sub) else None)
    return keys


def read_back(cell: str) -> object:
    return yaml.safe_load(cell.strip("`"))


def test_every_key_and_section_key_appears_with_its_default():
    table = rows(reference.render())
    want = expected(TrainConfig)
    assert set(TrainConfig.model_fields) <= set(table)
    assert set(want) == set(table), sorted(set(want) ^ set(table))
    for section in ("optimizer", "schedule.lr", "sampling", "workers", "ga", "kl", "train"):
        assert any(k.startswith((f"{section}.", f"{section} (kind: ")) for k in table), section
    for key, default in want.items():
        cell = table[key][1]
        if isinstance(default, BaseModel):
            assert cell.startswith("[its defaults](#"), (key, cell)
        else:
            assert read_back(cell) == default, (key, cell, default)


def test_choices_bounds_and_descriptions_come_from_the_schema():
    table = rows(reference.render())
    assert table["algorithm"][0] == "`es` | `ga` | `cmaes` | `lmmaes`"
    assert table["population"][2].startswith("≥ 1, ≤ ")
    assert table["seed"][2] == "≥ 0, < 2^63"
    assert table["sigma"][2] == "> 0.0, ≤ 10.0, finite"
    assert table["train (kind: lowrank).rank"][0] == "`1` | `4` | `16` | `64`"
    assert table["keep_samples"][3] == TrainConfig.model_fields["keep_samples"].description
    assert "[GASpec](#ga)" in table["ga"][0] and table["ga"][1] == "`null`"


def test_a_new_field_appears_by_itself():
    class Inner(BaseModel):
        """An inner section."""

        depth: int = Field(3, ge=1, description="how deep")

    class Outer(BaseModel):
        mode: Literal["a", "b"] = "b"
        inner: Inner = Inner(depth=5)  # the parent's default wins over the model's own
        extra: Inner | None = None

    text = reference.render(Outer)
    table = rows(text)
    assert set(table) == {"mode", "inner", "extra", "inner.depth", "extra.depth"}
    assert read_back(table["mode"][1]) == "b" and read_back(table["inner.depth"][1]) == 5
    assert read_back(table["extra.depth"][1]) == 3 and table["inner.depth"][3] == "how deep"
    assert "## inner\n\nAn inner section." in text
    assert reference.missing_descriptions(Outer) == ["mode", "inner", "extra"]


def test_every_shipped_field_has_a_description():
    """The reference leaves no meaning blank: a new field without `description=` fails here,
    named by its dotted key."""
    missing = reference.missing_descriptions()
    assert missing == [], f"fields without a description: {', '.join(missing)}"
