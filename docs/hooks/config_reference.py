"""MkDocs hook: the configuration reference, rendered at build time from the pydantic schema
itself (`TrainConfig`'s fields and every section model they hold), so a new key, default,
bound or description appears without anyone listing it. A page holding the marker
`<!-- config-reference -->` gets it in place of the marker.

One table per model: the top-level keys first, then one section per nested model (its
dotted path as the heading, its docstring as the introduction). Defaults are written as
YAML, so each one reads back (`yaml.safe_load`) as the value the config gets when the key
is left out; a nested default comes from the parent's default instance, not the model's
own, so a parent that sets a section differently is shown as it is."""

from __future__ import annotations

import inspect
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from markdown.extensions.toc import slugify
from pydantic import BaseModel
from pydantic.fields import FieldInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's schema, not another's
MARKER = "<!-- config-reference -->"
TOP = "top-level keys"


@dataclass(frozen=True)
class Section:
    """One table: the fields of `model` at `path` (dotted; empty for TrainConfig itself)."""

    path: str
    model: type[BaseModel]
    defaults: BaseModel | None  # the parent's default instance of `model`, if it has one

    @property
    def title(self) -> str:
        return self.path or TOP

    @property
    def anchor(self) -> str:
        return slugify(self.title, "-")


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (`X`, `X | None`, `Literal[...] | X`, `list[X]`)."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in models_in(arg)]


def sections(model: type[BaseModel], path: str = "", defaults: BaseModel | None = None) -> list[Section]:
    """`model`'s section, then its nested models' sections, depth first in field order."""
    found = [Section(path, model, defaults)]
    for name, field in model.model_fields.items():
        nested = models_in(field.annotation)
        value = getattr(defaults, name, None) if defaults is not None else field.get_default(call_default_factory=True)
        for sub in nested:
            label = sub_path(f"{path}.{name}" if path else name, sub, nested)
            found += sections(sub, label, value if isinstance(value, sub) else None)
    return found


def default_of(section: Section, name: str) -> Any:
    field = section.model.model_fields[name]
    if section.defaults is not None:
        return getattr(section.defaults, name)
    if field.is_required():
        return inspect.Parameter.empty
    return field.get_default(call_default_factory=True)


def as_yaml(value: Any) -> str:
    """`value` in YAML's flow style, one line (what a config file would say)."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10**6)
    return text.strip().removesuffix("\n...").strip()


def code(text: str) -> str:
    return f"`{text}`"


def sub_path(key: str, model: type[BaseModel], nested: list[type[BaseModel]]) -> str:
    """The section path of `model` held by the field at `key`; when the field takes one of
    several sections, named by the `kind` that picks it (`train (kind: lora)`), as a user
    writes it, else by its class."""
    if len(nested) == 1:
        return key
    kind = model.model_fields.get("kind")
    if kind is not None and get_origin(kind.annotation) is Literal:
        return f"{key} (kind: {' | '.join(map(str, get_args(kind.annotation)))})"
    return f"{key} ({model.__name__})"


def type_text(annotation: Any, links: dict[type, str]) -> str:
    """A reader's name for an annotation: choices listed, sections linked."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(code(as_yaml(choice)) for choice in get_args(annotation))
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        text = " or ".join(type_text(arg, links) for arg in args if arg is not type(None))
        return f"{text} or `null`" if type(None) in args else text
    if origin in (list, tuple, set):
        (item, *_) = get_args(annotation) or (Any,)
        return f"list of {type_text(item, links)}"
    if origin is dict:
        return "mapping"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{links[annotation]})" if annotation in links else annotation.__name__
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def number(value: Any) -> str:
    if isinstance(value, int) and value >= 1 << 20 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return as_yaml(value)


BOUNDS = (  # annotated_types constraint, how it reads
    (annotated_types.Gt, "gt", "> {}"),
    (annotated_types.Ge, "ge", "≥ {}"),
    (annotated_types.Lt, "lt", "< {}"),
    (annotated_types.Le, "le", "≤ {}"),
    (annotated_types.MinLen, "min_length", "at least {} item(s)"),
    (annotated_types.MaxLen, "max_length", "at most {} item(s)"),
)


def holds_float(annotation: Any) -> bool:
    return annotation is float or (
        get_origin(annotation) is not Literal and any(map(holds_float, get_args(annotation)))
    )


def bounds_text(field: FieldInfo, model: type[BaseModel]) -> str:
    """The field's constraints as a reader writes them; "finite" where its model or the
    field refuses inf and NaN for a float."""
    said = []
    for constraint in field.metadata:
        for kind, attr, form in BOUNDS:
            if isinstance(constraint, kind):
                said.append(form.format(number(getattr(constraint, attr))))
    finite = [getattr(c, "allow_inf_nan", None) for c in field.metadata] + [model.model_config.get("allow_inf_nan")]
    if False in finite and holds_float(field.annotation):
        said.append("finite")
    return ", ".join(said)


def cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split()) if text else ""


def table(section: Section) -> list[str]:
    rows = ["| key | type | default | bounds | meaning |", "|---|---|---|---|---|"]
    for name, field in section.model.model_fields.items():
        key = f"{section.path}.{name}" if section.path else name
        nested = models_in(field.annotation)
        links = {m: slugify(sub_path(key, m, nested), "-") for m in nested}
        default = default_of(section, name)
        if default is inspect.Parameter.empty:
            shown = "required"
        elif isinstance(default, BaseModel):
            shown = f"[its defaults](#{links[type(default)]})"
        else:
            shown = code(as_yaml(default))
        rows.append("| " + " | ".join(
            cell(text) for text in (code(key), type_text(field.annotation, links), shown,
                                    bounds_text(field, section.model), field.description or "")
        ) + " |")
    return rows


def own_doc(model: type[BaseModel]) -> str:
    """The model's own docstring on one line (not one inherited from BaseModel)."""
    doc = model.__dict__.get("__doc__")
    return " ".join(inspect.cleandoc(doc).split()) if doc else ""


def render(model: type[BaseModel] | None = None) -> str:
    if model is None:
        from seedledger.engine.config import TrainConfig as model
    parts: list[str] = []
    for section in sections(model):
        parts += [f"## {section.title}", ""]
        if section.path and own_doc(section.model):
            parts += [own_doc(section.model), ""]
        parts += [*table(section), ""]
    return "\n".join(parts)


def missing_descriptions(model: type[BaseModel] | None = None) -> list[str]:
    """The dotted keys whose field carries no description (what the reference leaves blank)."""
    if model is None:
        from seedledger.engine.config import TrainConfig as model
    return [
        f"{s.path}.{name}" if s.path else name
        for s in sections(model) for name, field in s.model.model_fields.items() if not field.description
    ]


def on_page_markdown(markdown: str, page, config, files) -> str:
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown
