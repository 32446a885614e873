"""Answers checked with Hugging Face's ``math-verify`` (LaTeX and expression equivalence),
run in the sandbox.

math-verify parses model text with sympy (``parse_expr`` evaluates Python), and bounds
its work with ``signal.alarm``, which counts wall-clock time and only works on a main
thread. So it runs here only in the sandbox (``trainers.sandbox``, job ``math``), with its
own timeouts off and the item's CPU-second limit as the bound: the same answer gets the
same verdict on every run, in any thread or worker, and a hostile answer (``9^{9^{9^9}}``)
costs at most ``cpu_seconds`` and scores 0.

The model's answer is the content of its last ``\\boxed{…}``, else of its last
``<answer>`` span, else its last ``MAX_TAIL`` characters (math-verify finds the answer in
free text itself). An exact numeric match is accepted first without the sandbox.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from seedledger.trainers.sandbox import Limits, shared_sandbox

from .answers import as_text, extract_tag, parse_number
from .combine import RewardFn

MAX_ANSWER = 1_000
"""Longest extracted answer sent to math-verify (characters); a longer one scores 0."""
MAX_TAIL = 1_000
"""Characters of the completion's end sent when it boxes or tags no answer."""
_MARKERS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{…}`` (or ``\\fbox{…}``), braces balanced; None
    when there is none or it is not closed. One scan from the marker: linear."""
    start = max(text.rfind(m) for m in _MARKERS)
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0 or text[start:brace].strip() not in _MARKERS:
        return None
    depth = 0
    for i in range(brace, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i]
    return None


def candidate(text: str) -> tuple[str | None, str]:
    """(the extracted answer or None, the text math-verify is given)."""
    found = last_boxed(text)
    if found is None:
        found = extract_tag(text)
    if found is None:
        return None, text[-MAX_TAIL:]
    return found, "\\boxed{" + found + "}"


def math_verify_reward(gold_of: Callable[[Any], str], cpu_seconds: int = 5) -> RewardFn:
    """A TRL-style reward over an ``answer`` column: 1.0 when the model's answer equals the
    reference (``gold_of(cell)``, LaTeX without ``\\boxed``), else 0.0; never raises."""
    limits = Limits(cpu_seconds=cpu_seconds, memory_mb=1024)

    def reward(prompts: list[Any], completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
        scores: list[float | None] = [0.0] * len(completions)
        items, where = [], []
        for j, (completion, cell) in enumerate(zip(completions, answer, strict=True)):
            gold = gold_of(cell)
            found, text = candidate(as_text(completion))
            if found is not None and len(found) > MAX_ANSWER:
                continue
            ref, got = parse_number(gold), parse_number(found) if found is not None else None
            if ref is not None and got is not None and ref == got:
                scores[j] = 1.0
                continue
            items.append({"gold": "\\boxed{" + gold + "}", "answer": text})
            where.append(j)
        for j, outcome in zip(where, shared_sandbox().run("math", items, limits=limits), strict=True):
            scores[j] = 1.0 if outcome.ok and outcome.value == 1.0 else 0.0
        return scores

    reward.__name__ = "math_verify"
    return reward
