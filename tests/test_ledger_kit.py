"""Helpers for the ledger tests (no tests here): records, a key mixer, process helpers."""

from __future__ import annotations

import math
import random
import struct

from seedledger.ledger import GenerationRecord, Ledger, MemberRecord

M64 = (1 << 64) - 1


def mix(run_key: int, g: int, j: int) -> int:
    """A stand-in for replay.noise.member_key (splitmix64 finalizer); the ledger never
    computes keys itself, it only takes this function for compact seed files."""
    z = (run_key ^ (g * 0x9E3779B97F4A7C15) ^ (j * 0xD1B54A32D192ED03)) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def round12(x: float) -> float:
    """<= 12 significant bits, like replay.noise.round_coefficient."""
    if x == 0 or not math.isfinite(x):
        return x
    m, e = math.frexp(x)
    return math.ldexp(round(m * 4096) / 4096, e)


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def record(
    g: int,
    n: int = 4,
    *,
    run_key: int = 7,
    rng: random.Random | None = None,
    coefficients: list[float] | None = None,
    mirrored: bool = True,
    samples: bool = False,
) -> GenerationRecord:
    rng = rng or random.Random(g)
    members = []
    for j in range(n):
        pair = j // 2 if mirrored else j
        c = coefficients[j] if coefficients else round12(rng.gauss(0, 1e-4))
        members.append(
            MemberRecord(
                index=j,
                key=mix(run_key, g, pair),
                sign=-1 if mirrored and j % 2 else 1,
                reward=rng.random(),
                coefficient=c,
                components={"format": rng.random(), "answer": None},
                samples=[{"prompt": "p", "output": f"o{j}", "reward": 0.5}] if samples else None,
            )
        )
    return GenerationRecord(
        index=g,
        lr=5e-4,
        sigma=1e-3,
        population=n,
        optimizer={"name": "sgd", "lr": 5e-4},
        schedule_step=g - 1,
        batch_indices=[rng.randrange(1000) for _ in range(4)],
        members=members,
        fingerprint=f"{rng.getrandbits(128):032x}",
        timings={"eval": 0.25, "update": 0.01},
        extra={"note": "x"},
    )


def new_run(led: Ledger, name: str, run_key: int = 7, parent=None):
    return led.create_run(
        name,
        base_model="tiny",
        base_revision="r1",
        base_fingerprint="f" * 32,
        noise_spec="v1",
        dtype_policy="fp32-master",
        param_selection="all",
        config={"population": 4, "sigma": 1e-3},
        seed=0,
        run_key=run_key,
        parent=parent,
    )


def fill(led: Ledger, name: str, first: int, last: int, n: int = 4, run_key: int = 7) -> None:
    for g in range(first, last + 1):
        led.commit_generation(name, record(g, n, run_key=run_key))
