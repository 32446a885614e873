"""One line of text per event or value for the audit tables (engine.cli.audit_render):
bounded whatever the ledger holds, since payloads, names and figures come from ledgers and
history files others wrote (a table cell of megabytes took rich minutes to lay out)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from seedledger.engine.cli.audit import FP_PREFIX

CELL = 160  # characters of free text (an event's payload, a name) a table prints; --json gives all
MORE = " … (--json shows all)"


def clip(text: str, limit: int = CELL) -> str:
    """`text` cut to `limit` characters, saying where the rest is."""
    return text if len(text) <= limit else text[:limit] + MORE


def payload_text(payload: dict[str, Any], limit: int = CELL) -> str:
    """An event's payload as `k=v, k=v` (each value as str() prints it), built piece by
    piece and stopped once past `limit` characters: a payload of megabytes costs what the
    line shows, never its size."""
    out: list[str] = []
    size = 0
    for piece in _pieces(payload, top=True):
        out.append(piece[: limit + 1 - size])
        size += len(out[-1])
        if size > limit:
            break
    return clip("".join(out), limit)


def _pieces(value: Any, top: bool = False) -> Iterator[str]:
    """The text of `value` as str() writes it (`top`: a payload's `k=v, ...`), lazily."""
    if isinstance(value, dict):
        yield "" if top else "{"
        for i, (k, v) in enumerate(value.items()):
            yield ", " if i else ""
            yield f"{k}=" if top else f"{_repr(k)}: "
            yield from (_pieces(v) if not (top and isinstance(v, str)) else (v,))
        yield "" if top else "}"
    elif isinstance(value, list | tuple):
        yield "["
        for i, v in enumerate(value):
            yield ", " if i else ""
            yield from _pieces(v)
        yield "]"
    else:
        yield _repr(value)


def _repr(value: Any) -> str:
    """repr(value), of a long string's start only (the line is cut anyway)."""
    return repr(value[: CELL + 1] if isinstance(value, str) else value)


def num(x: float | None, fmt: str = ".3f") -> str:
    """A number as `fmt` formats it; None as a dash, anything else (a payload's) as text."""
    if x is None:
        return "–"
    return format(x, fmt) if isinstance(x, int | float) and not isinstance(x, bool) else clip(str(x))


def fp(value: str | None) -> str:
    """A fingerprint or digest as tables print it: its first FP_PREFIX characters."""
    return (value or "–")[:FP_PREFIX]


def imported_mark(imported: dict[str, Any] | None) -> str:
    """Before an imported event's line: whose it is and when its sender recorded it (the
    time column says when it was imported)."""
    if imported is None:
        return ""
    sent = str(imported.get("sent_at") or "–")[:19].replace("T", " ")
    return f"[imported from {fp(imported.get('from'))}…, sent {sent}] "


def event_line(kind: str, payload: dict[str, Any]) -> str:
    """One event in `log`: a summary for the kinds that have one, else its payload; at most
    CELL characters either way (`show` and --json give the whole record)."""
    summary = evaluation_line if kind == "evaluation" else _EVENT_LINES.get(kind)  # evaluation: the figures
    if summary is not None:
        try:
            return clip(summary(payload))
        except (TypeError, ValueError, KeyError, AttributeError):  # a payload of other types: as it is
            pass
    return payload_text(payload)


def _inputs_line(p: dict[str, Any]) -> str:
    """An `inputs` event in `log`: which session, from where, the digest and the counts."""
    return (f"{p.get('session')} from generation {p.get('from_generation')}: digest {fp(p.get('digest'))}, "
            f"{len(p.get('files') or {})} files, {len(p.get('tokenizer') or {})} tokenizer files")


def _accepted_line(p: dict[str, Any]) -> str:
    """An `inputs-accepted` event in `log`: the changes the session accepted."""
    from seedledger.ledger.provenance import short

    changes = [c for c in (p.get("changes") or [])[:8] if isinstance(c, dict)]  # the line shows a few
    return f"{p.get('session')} from generation {p.get('generation')}: " + "; ".join(
        f"{c.get('what')} {c.get('name')}: {short(c.get('before'))} -> {short(c.get('after'))}" for c in changes)


_EVENT_LINES = {"inputs": _inputs_line, "inputs-accepted": _accepted_line}


def evaluation_line(p: dict[str, Any]) -> str:
    """One `evaluation` event in `log`: where, how many rows, the mean, the paired change."""
    mean = num(p.get("mean", p.get("held_out_reward")), ".4f")
    line = f"@{p.get('generation')}: held-out {mean} on {p.get('rows')} rows"
    c = p.get("change")
    if isinstance(c, dict) and "mean" in c:
        line += (f"; {c['mean']:+.4f} ± {c['stderr']:.4f} against {p.get('against')} "
                 f"({c['better']} better, {c['worse']} worse)")
    return line + (f" [{p['by']}]" if p.get("by") else "")
