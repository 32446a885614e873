"""A user's reward function, loaded by path in tests (``tests/data/user_reward.py:shout``)."""


def shout(prompts, completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [1.0 if t.isupper() else (None if not t else 0.0) for t in texts]


def broken(prompts, completions, **kwargs):
    raise RuntimeError("bug in user code")


def too_short(prompts, completions, **kwargs):
    return [1.0]
