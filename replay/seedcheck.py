"""What a replay can apply: the check `import` and `rebuild FILE.seeds` run on a seed file.

ledger.seedfile checks the format (types, sizes, what SQL columns hold) and round-trips
any float64; this module refuses well-formed values that no training run could have
written, so they are rejected at import instead of failing (or silently doing nothing)
later: an unknown perturbation kind in any segment, a coefficient that is not finite,
not within ±2**100 or not rounded to 12 significant bits, a σ that is not positive or
not rounded, an empty generation, an unknown optimizer rule or a non-finite setting, a
fingerprint that is not 32 lowercase hex digits, and a member (format 3) whose kind is
unknown or trains other parameters than its lineage, or whose σ is not positive, rounded and at most
training's bound, or that rides a `paths` rule (`ledger.seedio.check_member_file`, as export);
and a `paths` record of the file's own run with another path count than its config keeps.
The stored config's task settings are not replay's: engine.rebuild.seedcheck adds their
bounds (`trainers.tasks.bounds`) to this check.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.seedfile import SeedFile
from seedledger.ledger.seedio import check_member_file

from . import paths
from .kinds import from_run
from .noise import _MAX_COEF, _MIN_COEF, SIG_BITS, check_coefficient
from .update import RULES

FINGERPRINT = re.compile(r"[0-9a-f]{32}")
MAX_SIGMA = 10.0  # engine.config.MAX_SCALE: training refuses a larger σ (replay cannot import engine)
_LOW_BITS = np.uint64((1 << (52 - (SIG_BITS - 1))) - 1)  # float64 mantissa bits below 12 significant


def check_seedfile(sf: SeedFile) -> None:
    """Raise SeedLedgerError naming the first value a replay of `sf` cannot apply."""
    seen: set[tuple[str, str]] = set()
    for s in sf.steps:
        kind = (s.noise_spec, s.param_selection)
        if kind not in seen:
            try:
                from_run(*kind)
            except SeedLedgerError as exc:
                raise SeedLedgerError(f"segment {s.run!r} (generation {s.index}): {exc}") from None
            seen.add(kind)
    try:
        from_run(sf.noise_spec, sf.header["param_selection"])  # what a resume would use
    except SeedLedgerError as exc:
        raise SeedLedgerError(f"run {sf.header['run']!r}: {exc}") from None
    _fingerprint(sf.base_fingerprint, "base fingerprint")
    for g, fp in enumerate(sf.fingerprints, 1):
        _fingerprint(fp, f"generation {g} fingerprint")
    for s in sf.steps:
        if not s.keys:
            raise SeedLedgerError(f"generation {s.index} has no members")
        if not (s.sigma > 0 and _rounded(s.sigma)):  # a lineage's σ is checked by its fingerprints
            raise SeedLedgerError(f"generation {s.index}: σ {s.sigma!r} is not a positive rounded value")
        _optimizer(s.index, s.optimizer, len(s.keys))
        bad = _unrounded(s.coefficients)
        if bad is not None:
            raise SeedLedgerError(
                f"generation {s.index}: coefficient {bad!r} is not finite, within ±2**100 and "
                f"rounded to {SIG_BITS} significant bits"
            )
    _path_counts(sf)
    for g, lr in enumerate(sf.lrs, 1):
        if not (math.isfinite(lr) and lr >= 0):
            raise SeedLedgerError(f"generation {g}: lr {lr!r} is not a finite value >= 0")
    if sf.member is not None:
        _member(sf)


def _member(sf: SeedFile) -> None:
    """A member's perturbation must be one replay applies, on the parameters its lineage
    trains (the master it is added to)."""
    m = sf.member
    what = f"member {m.index} of generation {m.generation}"
    try:
        kind = from_run(m.noise_spec, m.param_selection)
    except SeedLedgerError as exc:
        raise SeedLedgerError(f"{what}: {exc}") from None
    trains = from_run(sf.noise_spec, sf.header["param_selection"]).adapter
    if kind.adapter != trains:
        raise SeedLedgerError(f"{what} perturbs other parameters ({m.param_selection}) than its lineage trains")
    _sigma(m.sigma, what)
    if _config_paths(sf.header.get("config")) != 0:  # the member's run keeps paths (a generation 1 too)
        check_member_file(sf.ref, {"name": paths.NAME})
    if sf.steps:  # and its generation follows its lineage's rule
        check_member_file(sf.ref, sf.steps[-1].optimizer)


def _config_paths(config: Any) -> int | None:
    """How many paths a run of `config` (a stored config) keeps: a GA's survivors − 1,
    LM-MA-ES's memory (+ p_σ when it adapts σ; None when memory is the dimension's default),
    none for the other algorithms."""
    def section(name: str) -> dict:
        value = cfg.get(name)
        return value if isinstance(value, dict) else {}

    cfg = config if isinstance(config, dict) else {}
    algorithm = cfg.get("algorithm")
    if algorithm == "ga":
        count, extra = section("ga").get("survivors", 1), -1
    elif algorithm == "lmmaes":
        count, extra = section("lmmaes").get("memory"), 1 if section("lmmaes").get("adapt_sigma", True) else 0
        if count is None:
            return None
    else:
        return 0
    if isinstance(count, bool) or not isinstance(count, int):
        raise SeedLedgerError(f"config: the path count of algorithm {str(algorithm)[:20]} is not an integer")
    return count + extra


def _path_counts(sf: SeedFile) -> None:
    """A `paths` record of the file's own run holds the paths its config keeps, no more:
    each path costs a replay a full copy of the trained weights."""
    run, want = sf.header["run"], _config_paths(sf.header.get("config"))
    for s in sf.steps:
        have = len(s.optimizer.get("move") or ()) if s.optimizer.get("name") == paths.NAME else 0
        if s.run == run and have and want is not None and have != want:
            raise SeedLedgerError(f"generation {s.index}: optimizer paths records {have} paths; the run's "
                                  f"config keeps {want} (ga.survivors − 1, or lmmaes.memory plus p_σ)")


def _sigma(sigma: float, what: str) -> None:
    """A member's σ as training bounds it (engine.config's MAX_SCALE), positive and rounded:
    no fingerprint covers a member, so this bound is all that keeps its weights finite."""
    if not (0 < sigma <= MAX_SIGMA and _rounded(sigma)):
        raise SeedLedgerError(f"{what}: σ {sigma!r} is not a positive rounded value at most {MAX_SIGMA}")


def _fingerprint(fp: str | None, what: str) -> None:
    if fp is not None and not FINGERPRINT.fullmatch(fp):
        raise SeedLedgerError(f"{what} {fp[:40]!r} is not 32 lowercase hex digits")


def _rounded(x: float) -> bool:
    try:
        return check_coefficient(x) == x
    except ValueError:
        return False


def _unrounded(coefficients: list[float]) -> float | None:
    """The first coefficient that `round_coefficient` would change or refuse (vectorized:
    a million members cost milliseconds), else None. -0.0 and 0.0 are rounded."""
    c = np.asarray(coefficients, dtype=np.float64)
    mag = np.abs(c)
    with np.errstate(invalid="ignore"):
        ok = (c == 0) | ((mag >= _MIN_COEF) & (mag <= _MAX_COEF) & ((c.view(np.uint64) & _LOW_BITS) == 0))
    bad = np.flatnonzero(~ok)
    return float(c[bad[0]]) if bad.size else None


def _optimizer(g: int, opt: dict[str, Any], members: int) -> None:
    name = opt.get("name", "sgd")
    if name == paths.NAME:  # LM-MA-ES, a GA's survivors: lists of numbers, one row per member
        paths.settings(opt, g, members)
        for member in range(members):
            paths.member_settings(opt, g, member)
        if len(opt["members"]) != members:
            raise SeedLedgerError(f"generation {g}: optimizer paths records {len(opt['members'])} member rows "
                                  f"for {members} members")
        return
    if name not in RULES:
        raise SeedLedgerError(f"generation {g}: unknown optimizer {str(name)[:40]!r}")
    for key, value in opt.items():
        if key == "name":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise SeedLedgerError(f"generation {g}: optimizer setting {key[:40]!r} is not a finite number")
