"""The ``python`` job graded outside the program's process (``trainers/sandbox_item.py``).

Standard library only, never imported by seedledger itself: the host passes this file's
text into the sandbox. An item is a program and a test. The program runs alone in one
caged process (``serve``); the test runs in another (``grade``), which holds the verdict
and the launcher's nonce. They meet through two pipes that carry plain data only: ``None``,
booleans, numbers, strings, bytes and the standard containers of them, as tagged JSON.
A value of any other kind stays in the program's process and reaches the test as a
``Remote``: the test may call it, read its attributes, index, measure and iterate it
(each answer again plain data), but it has no truth value, no equality and no ordering
here, so an object that claims to equal anything compares as nothing. A program can
therefore win a test only by the values it returns; it cannot reach the verdict (a
patched ``AssertionError`` or ``json`` lives in its own process, the nonce never does),
and the grader's uid (as root) or PID namespace (otherwise) keeps it from signalling
the grader. What the program's process sends is parsed with bounds, and anything that
is not a reply is ``malformed``.

Arguments reach the program as copies (an in-place change is not seen by the test). A
program's global named like a builtin or a standard-library module is not passed on:
the test gets the real ``abs`` and ``math``, so ``math.isclose`` is Python's. A module
the program imported reaches the test by name when it is in the standard library (the
test may use the ``math`` its program imported), else as a handle.
"""

from __future__ import annotations

import builtins
import itertools
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

if __package__:  # imported as trainers.sandbox_grader (tests, docs)
    from . import sandbox_codec as codec
else:  # imported by the launcher inside the cage, from /sandbox
    import sandbox_codec as codec

_OPAQUE = "a value from the program that is not plain data cannot be compared or tested for truth here"


class Remote(codec.Handle):
    """One of the program's objects, seen from the test: calls and reads go to the program's
    process and come back as plain data (or another Remote); it has no truth value,
    equality or order here."""

    __slots__ = ("_grader",)

    def __init__(self, ref: int, grader: Grader) -> None:
        super().__init__(ref)
        self._grader = grader

    def _ask(self, op: str, **fields: Any) -> Any:
        return self._grader.ask({"op": op, "ref": self.ref, **fields})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._ask("call", args=codec.encode(list(args), None), kwargs=codec.encode(kwargs, None))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __getitem__(self, key: Any) -> Any:
        return self._ask("getitem", key=codec.encode(key, None))

    def __len__(self) -> int:
        n = self._ask("len")
        if type(n) is not int:
            raise TypeError("len() of a program object was not an int")
        return n

    def __iter__(self) -> Iterator[Any]:
        return iter(self._ask("list"))

    def __contains__(self, item: Any) -> bool:
        return self._ask("contains", item=codec.encode(item, None)) is True

    def __str__(self) -> str:
        text = self._ask("str")
        return text if type(text) is str else "<program object>"

    def __repr__(self) -> str:
        return "<program object>"

    def _opaque(self, *_: Any) -> Any:
        raise TypeError(_OPAQUE)

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = _opaque  # type: ignore[assignment]


def _exception(name: Any) -> BaseException:
    """The test-side exception for one the program raised: the builtin of that name (so
    ``except ValueError`` works), else a plain Exception subclass named after it."""
    if not isinstance(name, str) or not name.isidentifier() or len(name) > 100:
        return codec.Malformed("bad exception name")
    found = getattr(builtins, name, None)
    if isinstance(found, type) and issubclass(found, BaseException):
        return found()
    return type(name, (Exception,), {})()


class Grader:
    """The test's side of the channel."""

    def __init__(self, channel: codec.Channel) -> None:
        self.channel = channel

    def _read(self) -> Any:
        try:
            return self.channel.recv()
        except codec.Lost:
            self.channel.failure = self.channel.failure or "lost"
            raise
        except codec.Malformed:
            self.channel.failure = self.channel.failure or "malformed"
            raise

    def ask(self, request: dict[str, Any]) -> Any:
        if self.channel.failure:
            raise codec.Malformed(self.channel.failure)
        try:
            self.channel.send(request)
        except OSError:  # the program's end is closed: it is gone or hung up
            self.channel.failure = self.channel.failure or "lost"
            raise codec.Lost() from None
        reply = self._read()
        if isinstance(reply, dict) and "raised" in reply and len(reply) == 1:
            raise _exception(reply["raised"])
        if not isinstance(reply, dict) or set(reply) != {"value"}:
            self.channel.failure = self.channel.failure or "malformed"
            raise codec.Malformed("not a reply")
        try:
            return codec.decode(reply["value"], lambda ref: Remote(ref, self))
        except codec.Malformed:
            self.channel.failure = self.channel.failure or "malformed"
            raise


def grade(test: str, read_fd: int, write_fd: int) -> dict[str, Any]:
    """Wait for the program's names, run the test against them, and say how it went."""
    grader = Grader(codec.Channel(read_fd, write_fd))
    namespace: dict[str, Any] = {"__name__": "__sandbox__", "__builtins__": builtins}
    try:
        first = grader._read()
        if isinstance(first, dict) and set(first) == {"raised"}:
            raise _exception(first["raised"])
        if not isinstance(first, dict) or set(first) != {"names"} or not isinstance(first["names"], dict):
            grader.channel.failure = "malformed"
            raise codec.Malformed("no names")
        for name, value in first["names"].items():
            if hasattr(builtins, name):  # the test's abs, isinstance, ... are Python's
                continue
            if name in sys.stdlib_module_names:  # and its math is Python's math
                namespace[name] = codec.LazyModule(name)
            else:
                namespace[name] = codec.decode(value, lambda ref: Remote(ref, grader))
        exec(compile(test, "<test>", "exec"), namespace)  # noqa: S102 - sandboxed
        outcome: dict[str, Any] = {"status": "ok", "value": 1.0}
    except MemoryError:
        outcome = {"status": "memory", "error": "MemoryError"}
    except BaseException as exc:  # noqa: BLE001 - the test's own verdict
        outcome = {"status": "failed", "error": type(exc).__name__}
    if grader.channel.failure == "lost":
        return {"status": "lost"}
    if grader.channel.failure:
        return {"status": "malformed", "error": "program"}
    return outcome


def serve(program: str, read_fd: int, write_fd: int) -> None:
    """In the program's process: run it, send its names, then answer until the grader
    hangs up. Nothing here is trusted by the grader."""
    channel = codec.Channel(read_fd, write_fd)
    objects: list[Any] = []
    namespace: dict[str, Any] = {"__name__": "__sandbox__"}
    me = os.getpid()
    failure = None
    try:
        exec(compile(program, "<program>", "exec"), namespace)  # noqa: S102 - sandboxed
        names = {k: _name(v, objects) for k, v in namespace.items() if k != "__builtins__"}
    except BaseException as exc:  # noqa: BLE001 - the program's failure, by name
        failure = type(exc).__name__
    if os.getpid() != me:  # a process the program forked: only the program's own process answers
        os._exit(0)
    if failure is not None:
        channel.send({"raised": failure})
        return
    channel.send({"names": names})
    while True:
        try:
            request = channel.recv()
        except (codec.Lost, codec.Malformed):
            return
        try:
            reply = {"value": codec.encode(_answer(request, objects), objects)}
        except BaseException as exc:  # noqa: BLE001 - raised by the program's code
            reply = {"raised": type(exc).__name__}
        if os.getpid() != me:
            os._exit(0)
        channel.send(reply)


def _name(value: Any, objects: list[Any]) -> Any:
    """A global of the program for the test: small plain data and modules as themselves,
    any other value (a generator, an open file, a 100 MiB buffer) as a handle, unread."""
    if isinstance(value, types.ModuleType) and value.__name__.split(".")[0] in sys.stdlib_module_names:
        return {"M": value.__name__}
    plain = (*codec.SIMPLE, dict, bytes, bytearray, str, int, float, complex, bool, range, type(None))
    if type(value) in plain and (not hasattr(value, "__len__") or len(value) <= codec.MAX_NAME_ITEMS):
        try:
            return codec.encode(value, None)
        except (TypeError, ValueError):  # nested too deep, or holding the program's objects
            pass
    objects.append(value)
    return {"H": len(objects) - 1}


def _answer(request: dict[str, Any], objects: list[Any]) -> Any:
    """One request of the grader's, run against the program's objects."""
    target = objects[request["ref"]]

    def arg(value: Any) -> Any:
        return codec.decode(value, objects.__getitem__)

    op = request["op"]
    if op == "call":
        return target(*arg(request["args"]), **arg(request["kwargs"]))
    if op == "getattr":
        return getattr(target, request["name"])
    if op == "getitem":
        return target[arg(request["key"])]
    if op == "len":
        return len(target)
    if op == "contains":
        return arg(request["item"]) in target
    if op == "list":
        return list(itertools.islice(iter(target), codec.MAX_ITEMS))
    if op == "str":
        return str(target)
    raise ValueError(f"unknown request {op!r}")
