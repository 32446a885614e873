"""Safe evaluation of the arithmetic expressions that models write (Countdown, arithmetic).

Model outputs are hostile input: they are parsed with ``ast`` and walked over a whitelist
(numbers, ``+ - * /``, unary minus/plus, parentheses), never ``eval``ed. Length, nesting
depth and magnitude are bounded before and during the walk, so every call returns quickly
with a value or ``None``; nothing raises. Arithmetic is exact (``Fraction``), so
``(1 + 2) / 3`` is exactly 1 and the caller's 1e-5 tolerance only matters for decimals.
"""

from __future__ import annotations

import ast
from fractions import Fraction

MAX_LENGTH = 256
"""Longest expression accepted, in characters (longer text is refused before parsing)."""
MAX_PARENS = 32
"""Deepest parenthesis nesting accepted (checked on the text, before parsing)."""
MAX_DEPTH = 100
"""Deepest syntax tree accepted (a chain ``1+1+…`` is as deep as it is long)."""
MAX_MAGNITUDE = 10**12
"""Largest absolute value of a literal or an intermediate result."""
MAX_NODES = 256
"""Most syntax-tree nodes accepted."""

_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div)
_UNARY = (ast.USub, ast.UAdd)


class _Refused(Exception):
    """Internal: the expression is outside the whitelist or the bounds."""


def safe_eval(expression: object) -> Fraction | None:
    """Return the exact value of ``expression``, or ``None`` when it is refused or invalid.

    Refused: anything but a str, text over ``MAX_LENGTH``, non-ASCII text, parentheses
    nested deeper than ``MAX_PARENS``, syntax errors, names, calls, ``**`` and every other
    operator, non-numeric literals, trees deeper than ``MAX_DEPTH``,
    magnitudes over ``MAX_MAGNITUDE``, division by zero. Never raises.
    """
    try:
        if not isinstance(expression, str) or len(expression) > MAX_LENGTH:
            return None
        text = expression.strip()
        if not text or not text.isascii() or _paren_depth(text) > MAX_PARENS:
            return None
        tree = ast.parse(text, mode="eval")
        budget = [MAX_NODES]
        return _walk(tree.body, 0, budget)
    except _Refused:
        return None
    except (SyntaxError, ValueError, TypeError, OverflowError, RecursionError, MemoryError,
            ZeroDivisionError, ArithmeticError):
        return None
    except Exception:  # noqa: BLE001 - a verifier must answer, whatever the input
        return None


def _paren_depth(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


def _check(value: Fraction) -> Fraction:
    if abs(value) > MAX_MAGNITUDE:
        raise _Refused
    return value


def _walk(node: ast.AST, depth: int, budget: list[int]) -> Fraction:
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0:
        raise _Refused
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Refused
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            raise _Refused
        if abs(value) > MAX_MAGNITUDE:
            raise _Refused
        return Fraction(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, _UNARY):
        operand = _walk(node.operand, depth + 1, budget)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, _BINOPS):
        left = _walk(node.left, depth + 1, budget)
        right = _walk(node.right, depth + 1, budget)
        if isinstance(node.op, ast.Add):
            return _check(left + right)
        if isinstance(node.op, ast.Sub):
            return _check(left - right)
        if isinstance(node.op, ast.Mult):
            return _check(left * right)
        if right == 0:
            raise _Refused
        return _check(left / right)
    raise _Refused


def numbers_used(expression: str) -> list[int]:
    """The integer literals of ``expression`` in order (ASCII digit runs, as TinyZero reads)."""
    out: list[int] = []
    run = ""
    for ch in expression[: MAX_LENGTH + 1]:
        if "0" <= ch <= "9":
            run += ch
        elif run:
            out.append(int(run))
            run = ""
    if run:
        out.append(int(run))
    return out
