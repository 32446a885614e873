"""``math``: GSM8K-layout rows (``question``, ``answer`` ending ``#### N``) or MATH-layout
rows (``problem``, ``solution`` with a ``\\boxed{…}`` final answer, optional ``answer``).

``verifier: numeric`` (the default for the GSM8K layout, unchanged): the model's answer is
the content of its last ``<answer>`` span, else the text after its last ``####``, else its
last number; it is correct when it equals the reference as an exact number after
normalization (thousands commas, ``$``, ``%``, trailing period, fractions).

``verifier: math_verify`` (the default for the MATH layout; ``trainers.rewards.mathverify``):
the numeric check first, then Hugging Face's math-verify (LaTeX and expression
equivalence: ``\\frac{1}{2}`` = ``0.5``, ``2\\sqrt{2}`` = ``\\sqrt{8}``, ``(x+1)^2`` =
``x^2+2x+1``), run in the sandbox because it hands model text to sympy's ``parse_expr``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.extras import ensure
from seedledger.trainers.rewards.answers import as_text, extract_tag, last_number, parse_number
from seedledger.trainers.rewards.combine import WeightedReward
from seedledger.trainers.rewards.mathverify import last_boxed, math_verify_reward
from seedledger.trainers.sandbox import require_sandbox

from .base import Messages, Task, chat
from .datafiles import as_scalar_text, check_columns, read_rows
from .datafiles import as_text as text_cell
from .sampling import split_rows

SYSTEM = (
    "Solve the problem step by step, then give the final number inside <answer></answer> "
    "tags, e.g. <answer>42</answer>."
)
MATH_SYSTEM = (
    "Solve the problem step by step, then give the final answer in LaTeX inside \\boxed{}, "
    "e.g. \\boxed{\\frac{1}{2}}."
)
MAX_NEW_TOKENS = 256
VERIFIERS = ("numeric", "math_verify")


def reference_answer(answer: str) -> str:
    """The final answer of a GSM8K answer field: the text after the last ``####``."""
    return answer.rsplit("####", 1)[-1].strip()


def model_answer(text: str) -> Any:
    tagged = extract_tag(text)
    if tagged is not None:
        return parse_number(tagged)
    if "####" in text:
        tail = text.rsplit("####", 1)[-1].strip().split("\n", 1)[0]
        value = parse_number(tail)
        return value if value is not None else last_number(tail)  # 0 is an answer, not a miss
    return last_number(text)


def math_reward(
    prompts: list[Any], completions: list[Any], answer: list[Any], **kwargs: Any
) -> list[float | None]:
    """1.0 when the model's number equals the reference number, else 0.0."""
    out: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        ref = parse_number(reference_answer(str(gold)))
        got = model_answer(as_text(completion))
        out.append(1.0 if ref is not None and got is not None and got == ref else 0.0)
    return out


def gsm8k_gold(answer: Any) -> str:
    """The reference of a GSM8K answer field as a plain number for math-verify (``1,000``
    would read as a tuple)."""
    value = parse_number(reference_answer(str(answer)))
    return str(value) if value is not None else reference_answer(str(answer))


def prompt(row: dict[str, Any]) -> Messages:
    if "problem" in row:
        return chat(MATH_SYSTEM, row["problem"])
    return chat(SYSTEM, row["question"])


def layout_of(rows: list[dict[str, Any]]) -> str:
    """``math`` when the first row has a ``problem`` column, else ``gsm8k`` (whose column
    checks then name what is missing)."""
    return "math" if rows and "problem" in rows[0] else "gsm8k"


def load_math_file(rows: list[dict[str, Any]], path: str | Path) -> list[dict[str, Any]]:
    """MATH-layout rows as {problem, answer}: ``answer`` if given, else the solution's last
    ``\\boxed{}``."""
    rows = check_columns(rows, path, {"problem": text_cell})
    out = []
    for i, row in enumerate(rows):
        col = "answer" if "answer" in row else "solution"
        if col not in row:
            have = ", ".join(sorted(map(str, row)))
            raise SeedLedgerError(f"{path}: row {i}: missing column 'solution' (or 'answer') (columns: {have})")
        try:
            cell = as_scalar_text(row[col]) if col == "answer" else text_cell(row[col])
        except ValueError as exc:
            raise SeedLedgerError(f"{path}: row {i}: column {col!r}: {exc}") from None
        answer = cell if col == "answer" else last_boxed(cell)
        if not answer or not answer.strip():
            raise SeedLedgerError(
                f"{path}: row {i}: column 'solution': no \\boxed{{}} answer in ...{cell[-40:]!r}"
            )
        out.append({"problem": row["problem"], "answer": answer.strip()})
    return out


def load_file(path: str | Path) -> list[dict[str, Any]]:
    rows = read_rows(path)
    if layout_of(rows) == "math":
        return load_math_file(rows, path)
    rows = check_columns(rows, path, {"question": text_cell, "answer": as_scalar_text})
    for i, row in enumerate(rows):
        if parse_number(reference_answer(row["answer"])) is None:
            raise SeedLedgerError(
                f"{path}: row {i}: column 'answer': no number after '####', got {row['answer'][-40:]!r}"
            )
    return rows


def load(
    path: str | None = None,
    test_path: str | None = None,
    data_seed: int = 0,
    seed: int = 0,
    test_size: int = 100,
    verifier: str | None = None,
    cpu_seconds: int = 5,
    rewards: list[WeightedReward] | None = None,
    **unused: Any,
) -> Task:
    """Rows from ``path`` (a seeded split gives the test rows) or ``path`` + ``test_path``;
    ``verifier`` defaults to ``numeric`` for GSM8K rows and ``math_verify`` for MATH rows."""
    if path is None:
        raise SeedLedgerError("task math: needs a file, e.g. 'math:data/gsm8k.jsonl'")
    rows = load_file(path)
    layout = layout_of(rows)
    test_rows = load_file(test_path) if test_path is not None else None
    if test_rows is not None and layout_of(test_rows) != layout:
        raise SeedLedgerError(f"task math: {test_path} and {path} have different layouts")
    verifier = verifier or ("math_verify" if layout == "math" else "numeric")
    if verifier not in VERIFIERS:
        raise SeedLedgerError(f"task math: verifier must be one of {', '.join(VERIFIERS)}, not {verifier!r}")
    if layout == "math" and verifier == "numeric":
        raise SeedLedgerError("task math: MATH-layout rows need verifier: math_verify (LaTeX answers)")
    if isinstance(cpu_seconds, bool) or not isinstance(cpu_seconds, int) or cpu_seconds < 1:
        raise SeedLedgerError(f"task math: cpu_seconds must be a positive integer, not {cpu_seconds!r}")
    train, test = split_rows(rows, test_rows, test_size, data_seed, path)
    if verifier == "numeric":
        default = WeightedReward("math", math_reward, 1.0)
    else:
        ensure("math_verify", "task math (verifier: math_verify)")  # imported by the sandbox's child
        require_sandbox("task math (verifier: math_verify)")
        gold = gsm8k_gold if layout == "gsm8k" else str
        default = WeightedReward("math", math_verify_reward(gold, cpu_seconds), 1.0)
    info = {"data_seed": data_seed, "source": str(path), "test_source": test_path}
    if layout == "math" or verifier != "numeric":  # older runs' descriptions stay as they were
        info.update(layout=layout, verifier=verifier)
    return Task("math", train, test, prompt, rewards or [default],
                seed=seed, max_new_tokens=MAX_NEW_TOKENS, info=info)
