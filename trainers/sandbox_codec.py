"""The wire between a ``python`` item's program and its grader (``sandbox_grader.py``).

Standard library only, never imported by seedledger itself: the host passes this file's
text into the sandbox. Newline-delimited JSON over a pair of pipes, each line read up to
``MAX_MESSAGE``, carrying plain data as tagged values: ``None``, booleans, numbers and
strings as themselves, containers, bytes, big ints, complex numbers, ranges, fractions
and decimals each under a one-letter tag, a module by name, and any other object of the
program's as a handle (``{"H": n}``) that stays in the program's process. Decoding is
bounded (nesting, length) and anything that is not one of these values is ``Malformed``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

MAX_MESSAGE = 32 << 20
MAX_DEPTH = 64
MAX_ITEMS = 1 << 20  # items read from an iterator the program returns
MAX_NAME_ITEMS = 1 << 12  # a longer global of the program stays there, as a handle
_dumps, _loads = json.dumps, json.loads  # a program may patch its json module: not our channel's
SIMPLE = {list: "L", tuple: "T", set: "S", frozenset: "F"}


class Handle:
    """One of the program's objects, seen from the test (``sandbox_grader.Remote``)."""

    __slots__ = ("ref",)

    def __init__(self, ref: int) -> None:
        self.ref = ref


class Malformed(Exception):
    """The program's process sent something that is not a reply."""


class Lost(BaseException):
    """The program's process is gone (the launcher reads why from its status)."""


class Channel:
    """Newline-delimited JSON over a pair of fds, read up to ``MAX_MESSAGE`` a line."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self.buffer = b""
        self.failure: str | None = None  # "lost" or "malformed": sticks, whatever the test does

    def send(self, message: dict[str, Any]) -> None:
        view = memoryview((_dumps(message) + "\n").encode())
        while view:
            view = view[os.write(self.write_fd, view):]

    def recv(self) -> Any:
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_MESSAGE:
                raise Malformed("too long")
            data = os.read(self.read_fd, 1 << 20)
            if not data:
                if self.buffer:
                    raise Malformed("cut short")
                raise Lost()
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return _loads(line)
        except Exception:  # noqa: BLE001 - any bytes (deep nesting: RecursionError)
            raise Malformed("not JSON") from None


def encode(value: Any, objects: list[Any] | None, depth: int = 0) -> Any:
    """Tagged JSON for plain data; anything else becomes a handle in ``objects`` (the
    program's side) or, on the test's side (``objects`` None), a TypeError."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deep to send")
    t = type(value)
    if value is None or t in (bool, str):
        return value
    if t is int:
        return value if abs(value) < 1 << 53 else {"I": hex(value)}
    if t is float:
        return value
    if isinstance(value, Handle):  # one of the program's objects, sent back to it
        return {"H": value.ref}
    tag = SIMPLE.get(t)
    if tag is not None:
        return {tag: [encode(v, objects, depth + 1) for v in value]}
    if t is dict:
        return {"D": [[encode(k, objects, depth + 1), encode(v, objects, depth + 1)] for k, v in value.items()]}
    if t in (bytes, bytearray):
        return {"B" if t is bytes else "BA": value.hex()}
    if t is complex:
        return {"C": [value.real, value.imag]}
    if t is range:
        return {"R": [value.start, value.stop, value.step]}
    if objects is None:
        raise TypeError("only plain data and the program's own objects can be passed to the program")
    return _encode_other(value, objects, depth)


def _encode_other(value: Any, objects: list[Any], depth: int) -> Any:
    """The program's values beyond the plain types: subclasses as their base, numpy as
    lists, iterators read out as lists, modules by name, the rest as handles."""
    module = type(value).__module__
    if isinstance(value, types.ModuleType) and value.__name__.split(".")[0] in sys.stdlib_module_names:
        return {"M": value.__name__}
    if module == "fractions" and type(value).__name__ == "Fraction":
        return {"Q": [encode(value.numerator, objects), encode(value.denominator, objects)]}
    if module == "decimal" and type(value).__name__ == "Decimal":
        return {"Dec": str(value)}
    if module.startswith("numpy") and hasattr(value, "tolist"):
        return encode(value.tolist(), objects, depth)
    for base in (bool, int, float, str, bytes, tuple, list, dict, set, frozenset):
        if isinstance(value, base):
            return encode(base(value), objects, depth)
    if isinstance(value, type({}.keys())) or isinstance(value, type({}.items())):
        return {"S": [encode(v, objects, depth + 1) for v in value]}
    if isinstance(value, (Iterator, type({}.values()))):
        return {"L": [encode(v, objects, depth + 1) for v in itertools.islice(value, MAX_ITEMS)]}
    objects.append(value)
    return {"H": len(objects) - 1}


def decode(obj: Any, handle: Any, depth: int = 0) -> Any:  # noqa: C901 - one branch per tag
    """Plain data from tagged JSON; ``handle(ref)`` makes a handle's value. Anything
    else is Malformed."""
    if depth > MAX_DEPTH:
        raise Malformed("nested too deep")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if not isinstance(obj, dict) or len(obj) != 1:
        raise Malformed("not a value")
    (tag, v), = obj.items()
    try:
        if tag in ("L", "T", "S", "F") and isinstance(v, list):
            items = [decode(x, handle, depth + 1) for x in v]
            return {"L": list, "T": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "D" and isinstance(v, list):
            return {decode(k, handle, depth + 1): decode(x, handle, depth + 1) for k, x in v}
        if tag in ("B", "BA") and isinstance(v, str):
            return (bytes if tag == "B" else bytearray).fromhex(v)
        if tag == "I" and isinstance(v, str):
            return int(v, 16)
        if tag == "C" and isinstance(v, list):
            return complex(*[float(x) for x in v])
        if tag == "R" and isinstance(v, list) and all(type(x) is int for x in v):
            return range(*v)
        if tag == "Q" and isinstance(v, list):
            from fractions import Fraction

            return Fraction(*[decode(x, handle, depth + 1) for x in v])
        if tag == "Dec" and isinstance(v, str):
            from decimal import Decimal

            return Decimal(v)
        if tag == "M" and isinstance(v, str) and v.split(".")[0] in sys.stdlib_module_names:
            return LazyModule(v)
        if tag == "H" and type(v) is int:
            return handle(v)
    except Malformed:
        raise
    except Exception:  # noqa: BLE001 - unhashable keys, bad counts: not one of our values
        raise Malformed(f"bad {tag}") from None
    raise Malformed(f"unknown tag {tag!r}")


class LazyModule:
    """A module the program imported, imported here when the test first uses it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import importlib

        return getattr(importlib.import_module(self._name), attr)
