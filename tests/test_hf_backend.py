"""HF backend: member weights from the master (bit-exact), deterministic batched generation."""

from __future__ import annotations

import pytest
import torch

from seedledger.engine.runtime.backends import Backend, make_backend
from seedledger.engine.runtime.backends.hf import HFBackend
from seedledger.replay import noise

SIGMA = noise.round_coefficient(1e-3)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().contiguous().view(torch.int32)


def _same_bits(model_params: dict[str, torch.Tensor], master: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(_bits(model_params[n]), _bits(master[n])) for n in master)


def _params(backend: HFBackend) -> dict[str, torch.Tensor]:
    return dict(backend.model.named_parameters())


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls on a shared 2-core box: one thread is many times faster than two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def backend(tiny_model_dir) -> HFBackend:
    return HFBackend(tiny_model_dir, batch_size=4)


@pytest.fixture(scope="module")
def master(backend) -> dict[str, torch.Tensor]:
    return backend.master()


def test_master_is_fp32_contiguous_named_clones(backend, master):
    names = [n for n, _ in backend.model.named_parameters()]
    assert list(master) == names and "lm_head.weight" not in master  # tied: once
    params = _params(backend)
    for n, t in master.items():
        assert t.dtype == torch.float32 and t.is_contiguous()
        assert t.data_ptr() != params[n].data_ptr()
    assert isinstance(backend, Backend)


def test_zero_member_and_load_master_are_bit_identical(backend, master):
    base = {n: t.clone() for n, t in master.items()}
    backend.load_member(master, key=7, sign=-1, sigma=0.0)
    assert _same_bits(_params(backend), base)
    backend.load_member(master, key=7, sign=1, sigma=SIGMA)
    assert not _same_bits(_params(backend), base)
    backend.load_master(master)
    assert _same_bits(_params(backend), base)
    assert _same_bits(master, base)  # the master itself is never touched


def test_member_weights_are_master_plus_scaled_noise(backend, master):
    key = noise.member_key(noise.run_key(3), 2, 5)
    backend.load_member(master, key, -1, SIGMA)
    params = _params(backend)
    for name, m in master.items():
        eps = noise.generate(noise.tensor_key(key, name), m.numel()).view(m.shape)
        expect = m + eps * (-SIGMA)
        assert torch.equal(_bits(params[name]), _bits(expect)), name
    # Tied weights follow the embedding, so the head sees the member too.
    assert torch.equal(backend.model.lm_head.weight, params["model.embed_tokens.weight"])
    # Another member, then this one again: same bits (built from the master each time).
    snapshot = {n: p.detach().clone() for n, p in params.items()}
    backend.load_member(master, key + 1, 1, SIGMA)
    backend.load_member(master, key, -1, SIGMA)
    assert _same_bits(params, snapshot)
    backend.load_master(master)


def test_bf16_model_keeps_an_fp32_master(tiny_model_dir, master):
    low = HFBackend(tiny_model_dir, dtype=torch.bfloat16)
    assert _same_bits(low.master(), master)
    key = 99
    low.load_member(master, key, 1, SIGMA)
    name, p = next(iter(_params(low).items()))
    assert p.dtype == torch.bfloat16
    m = master[name]
    eps = noise.generate(noise.tensor_key(key, name), m.numel()).view(m.shape)
    assert torch.equal(p, (m + eps * SIGMA).to(torch.bfloat16))


PROMPTS = [_chat(f"What is {a}+{b}?") for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1)]]
MIXED = [_chat("Hi"), _chat("Write a long sentence about the sea and the sky, please."), *PROMPTS]


def test_greedy_generation_is_deterministic(backend, master):
    backend.load_master(master)
    first = backend.generate(MIXED, max_new_tokens=8)
    assert len(first) == len(MIXED) and all(isinstance(s, str) and s for s in first)
    assert backend.generate(MIXED, max_new_tokens=8) == first
    assert len(set(first)) > 1  # the tiny model's output depends on its prompt
    assert backend.generate(MIXED, max_new_tokens=8, seed=123) == first  # seed alone: greedy


def test_seeded_sampling(backend, master):
    backend.load_master(master)
    kw = {"max_new_tokens": 8, "temperature": 1.0, "top_p": 0.95}
    a = backend.generate(MIXED, seed=1, **kw)
    assert backend.generate(MIXED, seed=1, **kw) == a
    assert backend.generate(MIXED, seed=2, **kw) != a
    assert a != backend.generate(MIXED, max_new_tokens=8)
    with pytest.raises(ValueError, match="seed"):
        backend.generate(MIXED, max_new_tokens=4, temperature=1.0)


def test_sampling_stream_does_not_depend_on_batch_split(tiny_model_dir, backend, master):
    """Equal-length prompts (no padding): batch 1 and batch 4 give the same samples."""
    backend.load_master(master)
    kw = {"max_new_tokens": 6, "seed": 5, "temperature": 1.0}
    one = HFBackend(tiny_model_dir, batch_size=1)
    assert one.generate(PROMPTS, **kw) == backend.generate(PROMPTS, **kw)


def test_make_backend_from_config(tiny_model_dir):
    from seedledger.engine.config import validate

    b = make_backend(validate({"model": "tiny", "batch_size": 3}), tiny_model_dir)
    assert isinstance(b, HFBackend) and b.batch_size == 3


@pytest.mark.slow
def test_smollm2_answers_arithmetic(smollm2_dir):
    b = HFBackend(smollm2_dir)
    (answer,) = b.generate([_chat("What is 3+4?")], max_new_tokens=12)
    assert answer.startswith("3 + 4 = 7"), answer


LENGTHS = [
    _chat("Hi"),
    _chat("Write a long sentence about the sea, the sky, the wind and the boats, please."),
    _chat("What is 2+2?"),
    _chat("Name three colours, then three animals, then three cities in Europe."),
    _chat("Ok"),
    _chat("Tell me a story about a cat who learns to count to ten in a single afternoon."),
    _chat("Why?"),
    _chat("Summarise: the quick brown fox jumps over the lazy dog."),
]


def test_left_padding_mixed_lengths_batch_8_equals_batch_1(tiny_model_dir, master):
    """Eight prompts of very different lengths in one left-padded batch decode greedily to
    what each decodes alone (padding, attention mask and positions are right)."""
    eight = HFBackend(tiny_model_dir, batch_size=8)
    one = HFBackend(tiny_model_dir, batch_size=1)
    lengths = {len(eight._encode([p])["input_ids"][0]) for p in LENGTHS}
    assert len(lengths) >= 6  # really mixed: the batch is mostly padding for the short ones
    for b in (eight, one):
        b.load_member(master, key=321, sign=1, sigma=SIGMA)
    batched = eight.generate_ids(LENGTHS, max_new_tokens=10)
    alone = one.generate_ids(LENGTHS, max_new_tokens=10)
    assert batched == alone
    assert len({tuple(ids) for ids in alone}) > 1


def test_prompt_stream_seed_of_sample_zero_is_unchanged():
    from seedledger.engine.runtime.backends.seeded_sampling import prompt_stream_seed
    from seedledger.replay.hashing import splitmix64

    assert (prompt_stream_seed(7, 3), prompt_stream_seed(7, 3, 2)) == (3879072848308665546, 334283646672543036)
    for seed, index in [(0, 0), (1, 2), (2**64 - 1, 7), (12345, 99)]:
        old = splitmix64(splitmix64(seed) ^ index) >> 1  # the seed before samples existed
        assert prompt_stream_seed(seed, index) == prompt_stream_seed(seed, index, 0) == old
        assert len({prompt_stream_seed(seed, index, s) for s in range(8)}) == 8


def test_several_samples_per_prompt(backend, master):
    backend.load_master(master)
    kw = {"max_new_tokens": 6, "seed": 11, "temperature": 1.0}
    plain = backend.generate(MIXED, **kw)
    assert backend.generate(MIXED, samples=1, **kw) == plain
    three = backend.generate(MIXED, samples=3, **kw)
    assert len(three) == 3 * len(MIXED)
    assert three[::3] == plain  # sample 0 of each prompt is plain seeded sampling
    assert backend.generate(MIXED, samples=3, **kw) == three
    assert any(len({three[3 * i + s] for s in range(3)}) > 1 for i in range(len(MIXED)))
    greedy = backend.generate(MIXED, max_new_tokens=6)
    assert backend.generate(MIXED, max_new_tokens=6, samples=2) == [g for g in greedy for _ in range(2)]
    with pytest.raises(ValueError, match="samples"):
        backend.generate(MIXED, samples=0, **kw)
