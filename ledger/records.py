"""The plain records the ledger takes and gives: no ORM objects leak out of the package."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any


@dataclass
class MemberRecord:
    """One population member: its noise key and sign, its reward, the coefficient applied.

    `reward` is NaN when unknown (e.g. a generation imported from a seed file).
    `samples` (per-sample prompts/outputs/rewards) is optional audit data, stored zstd'd.
    `row_scores`: the member's score on each of the generation's batch rows (NaN: unscored),
    whose mean over the scored rows is `reward` (ledger.rowscores); None when not kept.
    """

    index: int
    key: int
    sign: int
    reward: float
    coefficient: float
    components: dict[str, float | None] = field(default_factory=dict)
    samples: list[dict[str, Any]] | None = None
    row_scores: list[float] | None = None


@dataclass
class GenerationRecord:
    """Everything one generation committed: hyperparameters in force, members, fingerprint."""

    index: int
    lr: float
    sigma: float
    population: int
    optimizer: dict[str, Any]
    schedule_step: int
    batch_indices: list[int]
    members: list[MemberRecord]
    fingerprint: str | None
    timings: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    committed_at: datetime | None = None  # set by the ledger; ignored on commit
    # The perturbation of this generation where it differs from its run's (a seed file's
    # lineage imported as one run, whose forks changed kind); None: the run's own.
    noise_spec: str | None = None
    param_selection: str | None = None

    def reward_stats(self) -> dict[str, float | None]:
        """mean / std (population) / min / max over known rewards; None when none known."""
        vals = [m.reward for m in self.members if not math.isnan(m.reward)]
        if not vals:
            return {"mean": None, "std": None, "min": None, "max": None}
        mean = math.fsum(vals) / len(vals)
        var = math.fsum((v - mean) ** 2 for v in vals) / len(vals)
        return {"mean": mean, "std": math.sqrt(var), "min": min(vals), "max": max(vals)}


# Where a generation's fields travel beyond its ledger, "members.X" for a member's: the
# seed file carries what replay needs, its history file (ledger.historyfile) the audit;
# the rest stays in the ledger (samples are model outputs; row scores are `attribute`'s
# and travel only as the bytes the chain hashed, ledger.historychain).
# Inside the ledger the record is one row (ledger.rows), which the chain hashes as stored
# (ledger.chain). tests/test_codec.py holds every field to exactly one place, so a field
# added to a record cannot be left behind by `export` unnoticed.
SEED_FILE = ("index", "lr", "sigma", "population", "optimizer", "schedule_step", "fingerprint", "noise_spec",
             "param_selection", "members.index", "members.key", "members.sign", "members.coefficient")
HISTORY_FILE = ("batch_indices", "timings", "extra", "committed_at", "members.reward", "members.components")
LEDGER_ONLY = ("members.samples", "members.row_scores")


@dataclass
class ReplayStep:
    """What replay needs to apply one generation: keys and exact coefficients in member order,
    and the perturbation its run used (`noise_spec`, `param_selection`: per run, so a fork
    may perturb differently from its parent)."""

    run: str
    index: int
    keys: list[int]
    coefficients: list[float]
    sigma: float
    optimizer: dict[str, Any]
    noise_spec: str = "v1"  # the perturbation kind of the step's own run (replay.perturbation)
    param_selection: str = "all"


@dataclass(kw_only=True)
class RunSpec:
    """What a run is created with: its base model, the settings that fix its replay, its
    provenance. The one list of a run's own columns; RunInfo adds what the ledger assigns.
    `software` None records this Python's version, `host` None this host's name."""

    base_model: str
    base_revision: str | None = None
    base_fingerprint: str | None = None
    noise_spec: str
    dtype_policy: str = "fp32-master"
    param_selection: str = "all"
    config: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    run_key: int
    software: dict[str, Any] | None = None
    host: str | None = None


@dataclass(kw_only=True)
class RunInfo(RunSpec):
    """A run as the ledger holds it: its spec, identity, status and parent (forks)."""

    id: int
    name: str
    created_at: datetime
    status: str
    parent: tuple[str, int] | None  # (parent run name, generation forked from)

    @property
    def parent_run(self) -> str | None:
        return self.parent[0] if self.parent else None

    @property
    def parent_generation(self) -> int:
        return self.parent[1] if self.parent else 0

    def spec(self) -> RunSpec:
        """The settings this run was created with (for a fork or a copy of it)."""
        return RunSpec(**{f.name: getattr(self, f.name) for f in fields(RunSpec)})


@dataclass
class AnchorInfo:
    """A full-weight cache of `run@generation`: content-addressed file, checked by fingerprint."""

    run: str
    generation: int
    path: str
    sha256: str
    fingerprint: str
    size: int
    created_at: datetime


@dataclass
class EventInfo:
    """One audit-trail entry (resume, fork, verify, lease change, error...). An imported one
    (a history file's, or a seed file's sessions) names the seed file it came with
    (`origin`, its digest) and when the sender recorded it (`sent_at`; `at` is when it was
    imported): the sender's trail, never this ledger's own."""

    id: int
    run: str | None
    at: datetime
    kind: str
    payload: dict[str, Any]
    origin: str | None = None
    sent_at: datetime | None = None

    @property
    def imported(self) -> bool:
        return self.origin is not None


def missing_fingerprint(
    base_fingerprint: str | None, fingerprints: Mapping[int, str | None]
) -> tuple[int, str] | None:
    """What leaves a replay unchecked, or None: (0, why) when the base has no fingerprint,
    else (g, why) for the first generation of `fingerprints` (generation -> fingerprint)
    that has none. A replay with nothing to compare against is never "verified"."""
    if base_fingerprint is None:
        return 0, "the base model has no fingerprint"
    missing = [g for g, fp in fingerprints.items() if fp is None]
    return (min(missing), f"generation {min(missing)} has no fingerprint") if missing else None
