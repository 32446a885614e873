"""Rewards that vary with the weights of a random model, so tiny runs really update."""


def _text(completion) -> str:
    """TRL passes conversational completions as a list of messages."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion)
    return completion


def vowel_share(prompts, completions, **columns):
    """Share of vowels in the completion: a smooth-ish signal for any model."""
    texts = [_text(c).lower() for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]
