"""`seedledger pbt`: population-based training whose exploit step is a fork.

K members train in synchronous rounds of `interval` generations. After round r every
member is scored on held-out rows (`engine.runtime.scoring.heldout`) at generation r·interval; the weakest
`fraction` of them (at least one) are each replaced by a fork of a randomly chosen member of
the strongest `fraction` at its latest generation (exploit: a ledger row, no checkpoint
copy), with that member's lr and σ each multiplied by 0.8 or 1.25 (explore, as `--set`).
A replacement happens only when the donor scored strictly higher. Round 0's members start
from the config with their own seeds (seed + slot) and, but for slot 0, lr and σ drawn
log-uniformly within ×/÷2. The fork tree is the PBT history (`seedledger log --graph`):

    NAME-m<slot>            the member that started in slot <slot>
    NAME-m<slot>-r<round>   the fork that took slot <slot> after round <round>

Why a small driver and not Ray Tune's PopulationBasedTraining. Ray Tune keeps its own
experiment state (trial checkpoints, scheduler state in an experiment directory) beside the
ledger and decides asynchronously, as results arrive; both break what this driver gets for
free from the ledger: (1) resumable after SIGKILL from the ledger alone: the runs' names
say which slot and round they are, `pbt-score` events hold the scores already taken (a
rerun recomputes each and refuses one that disagrees: a copied ledger may forge them), the
runs resume from their last committed generation, so rerunning the command continues and
nothing trains twice; code a member's stored config names beyond the user's config runs
only with `trust_code`, and a member's stored config must be the one the user's config makes
for its explored lr, σ and seed (`engine.search.tunecheck`, as `tune` holds a trial); (2)
reproducible: rounds are synchronous, scores are greedy held-out rewards of replayed
weights, ties go to the lower slot, and every random choice comes from a generator seeded
by (seed, round, slot): the same config and seed give the same forks,
settings and fingerprints. What remains of Ray Tune's value is parallelism, which a round's
members get here as Ray tasks when the config says `workers.pool: ray`.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from seedledger.engine.config import load_config, validate
from seedledger.engine.runtime import session
from seedledger.engine.runtime.setup.inputs import reading
from seedledger.engine.search import tunecheck
from seedledger.engine.search.tune import override
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError

UP, DOWN = 1.25, 0.8


def member_run(name: str, slot: int, round_: int) -> str:
    return f"{name}-m{slot}" if round_ == 0 else f"{name}-m{slot}-r{round_}"


def _rng(seed: int, round_: int, slot: int) -> random.Random:
    return random.Random(f"seedledger-pbt:{seed}:{round_}:{slot}")  # str seeds hash with SHA-512


def _event(ledger: Ledger, run: str, kind: str, **match: Any) -> dict | None:
    for e in ledger.events(run, kind=kind):
        if all(e.payload.get(k) == v for k, v in match.items()):
            return e.payload
    return None


def _rows(cfg, rows: int | None, skip: int) -> int:
    """The held-out rows every round scores, as a number (the recorded settings compare it)."""
    from seedledger.engine.runtime.setup.preflight import held_out_rows
    from seedledger.trainers.tasks import load_task

    return held_out_rows(load_task(cfg.task, seed=cfg.seed), rows, skip, owner="pbt")


class PBT:
    def __init__(
        self, ledger: Ledger, config: str | Path, population: int, rounds: int, *,
        name: str | None = None, interval: int | None = None, fraction: float = 0.25,
        rows: int | None = None, skip: int = 0, overrides: list[str] = (),
        say: Callable[[dict[str, Any]], None] = lambda event: None, trust_code: bool = False,
    ):
        if population < 2 or rounds < 1:
            raise SeedLedgerError("pbt: needs --population >= 2 and --rounds >= 1")
        if not 0 < fraction <= 0.5:
            raise SeedLedgerError("pbt: --fraction must be in (0, 0.5]")
        self.ledger, self.config, self.overrides, self.say = ledger, str(config), list(overrides), say
        self.cfg = load_config(config, self.overrides)
        self.name = name or Path(config).stem
        self.K, self.R = population, rounds
        self.interval = interval or max(1, self.cfg.generations // rounds)
        self.replace = max(1, math.floor(population * fraction))
        self.rows, self.skip = _rows(self.cfg, rows or self.cfg.evaluation.rows, skip), skip
        self.seed = self.cfg.seed
        self.trust_code = trust_code
        self.own = set(session.stored_code(self.cfg.model_dump(mode="json")))  # the user's code
        self._held_out = None
        self.settings = {
            "pbt": self.name, "population": population, "rounds": rounds, "interval": self.interval,
            "fraction": fraction, "rows": self.rows, "skip": skip, "seed": self.seed,
        }

    # -- the slots' runs, as the ledger says ---------------------------------------------
    def run_in(self, slot: int, round_: int) -> str:
        """The run that trains in `slot` during round `round_` (1-based): the newest one made
        for the slot before that round."""
        for made in range(round_ - 1, 0, -1):
            if self.ledger.has_run(member_run(self.name, slot, made)):
                return member_run(self.name, slot, made)
        return member_run(self.name, slot, 0)

    def check_code(self, run: str) -> bool:
        """A member run may come from a copied ledger: code its stored config names beyond
        the user's config's runs only with `trust_code`. True once allowed (for `resume`)."""
        refs = [r for r in session.stored_code(self.ledger.get_run(run).config) if r not in self.own]
        session.check_stored_code(refs, f"run {run}", self.trust_code)
        return True

    def existing_runs(self) -> list[tuple[str, int, int]]:
        """(run, slot, round made) of every member run already in the ledger."""
        return [(member_run(self.name, slot, round_), slot, round_) for slot in range(self.K)
                for round_ in range(self.R) if self.ledger.has_run(member_run(self.name, slot, round_))]

    def first_settings(self, slot: int) -> tuple[float, float, int]:
        """Round 0's (lr, σ, seed) of `slot`: seed + slot, and but for slot 0 lr and σ drawn
        log-uniformly within ×/÷2."""
        lr, sigma = self.cfg.lr, self.cfg.sigma
        if slot:
            rng = _rng(self.seed, 0, slot)
            lr, sigma = lr * 2 ** rng.uniform(-1, 1), sigma * 2 ** rng.uniform(-1, 1)
        return lr, sigma, self.seed + slot

    def check_config(self, run: str, slot: int, round_: int) -> None:
        """A member run may come from a copied ledger: its stored config must be what the
        user's config makes for its explored settings: round 0's as drawn; a fork's lr and σ
        within what `round_` explores reach (×/÷2, then ×/÷1.25 a round) and one slot's seed."""
        if round_ == 0:
            lr, sigma, seed = self.first_settings(slot)
        else:
            stored = self.ledger.get_run(run).config
            lr, sigma, seed = stored.get("lr"), stored.get("sigma"), stored.get("seed")
            reach = 2 * UP**round_ * (1 + 1e-9)
            for key, value, base in (("lr", lr, self.cfg.lr), ("sigma", sigma, self.cfg.sigma)):
                number = isinstance(value, int | float) and not isinstance(value, bool)
                if not (number and base / reach <= value <= base * reach):
                    raise tunecheck.ForeignTrial(
                        f"run {run}'s stored {key} {tunecheck.short(value)} is beyond what pbt's explore "
                        f"reaches by round {round_} from {base!r}")
            if type(seed) is not int or seed not in range(self.seed, self.seed + self.K):
                raise tunecheck.ForeignTrial(f"run {run}'s stored seed {tunecheck.short(seed)} is no slot's")
        sets = [override("lr", lr), override("sigma", sigma), override("seed", seed)]
        expected = tunecheck.expected_config(Path(self.config), [*self.overrides, *sets])
        tunecheck.check_config(self.ledger, run, expected, self.trust_code, "the pbt config")

    def start(self) -> None:
        """Round 0: K members from the config (idempotent)."""
        first = member_run(self.name, 0, 0)
        if self.ledger.has_run(first):
            made = _event(self.ledger, first, "pbt-settings")
            if made is not None and made != self.settings:
                raise SeedLedgerError(f"pbt {self.name!r} was started with {made}; rerun with the same settings")
        for slot in range(self.K):
            run = member_run(self.name, slot, 0)
            lr, sigma, seed = self.first_settings(slot)
            sets = [override("lr", lr), override("sigma", sigma), override("seed", seed)]
            if not self.ledger.has_run(run):
                session.start(self.ledger, self.config, run, [*self.overrides, *sets], 0)
            if _event(self.ledger, run, "pbt-member") is None:
                if slot == 0:
                    self.ledger.log_event(run, "pbt-settings", self.settings)
                self.ledger.log_event(run, "pbt-member", {"pbt": self.name, "slot": slot, "lr": lr,
                                                          "sigma": sigma, "seed": seed})

    def train_round(self, round_: int) -> None:
        """Every slot's run up to generation round·interval (in parallel on Ray if asked)."""
        target = round_ * self.interval
        todo = [(run, target - self.ledger.latest_generation(run))
                for run in (self.run_in(s, round_) for s in range(self.K))]
        todo = [(run, n) for run, n in todo if n > 0]
        if self.cfg.workers.pool == "ray" and len(todo) > 1:
            _train_on_ray(self.ledger.location, todo, all(self.check_code(run) for run, _ in todo),
                          str(Path(self.config).resolve()))
        else:
            for run, n in todo:
                session.resume(self.ledger, run, n, trust_code=self.check_code(run))
        for run, _ in todo:
            self.say({"event": "trained", "round": round_, "run": run, "generation": target})

    def score(self, run: str, generation: int) -> float:
        from seedledger.engine.runtime.scoring.heldout import HeldOut

        if self._held_out is None:
            self._held_out = HeldOut(self.cfg, self.rows, self.skip)
        return self._held_out.score(self.ledger, run, generation)

    def scores(self, round_: int) -> list[float]:
        """Each slot's held-out score. A `pbt-score` event already in the ledger (a killed
        driver's) is data that drives exploitation: it is recomputed (scores are greedy
        rewards of replayed weights, deterministic) and refused unless it agrees."""
        target, out = round_ * self.interval, []
        for slot in range(self.K):
            run = self.run_in(slot, round_)
            got = _event(self.ledger, run, "pbt-score", pbt=self.name, round=round_)
            score = self.score(run, target)
            if got is None:
                got = {"pbt": self.name, "round": round_, "slot": slot, "generation": target, "score": score}
                self.ledger.log_event(run, "pbt-score", got)
            elif got != {"pbt": self.name, "round": round_, "slot": slot, "generation": target, "score": score}:
                raise SeedLedgerError(
                    f"run {run}'s pbt-score event for round {round_} says {got.get('score')!r} (slot "
                    f"{got.get('slot')!r}, generation {got.get('generation')!r}); its weights score {score!r} "
                    f"(slot {slot}, generation {target}): the event is not this ledger's"
                )
            self.say({"event": "scored", "round": round_, "run": run, "score": got["score"]})
            out.append(got["score"])
        return out

    def exploit(self, round_: int, scores: list[float]) -> None:
        """Replace the weakest by perturbed forks of the strongest (idempotent)."""
        ranked = sorted(range(self.K), key=lambda s: (-scores[s], s))
        top, bottom = ranked[: self.replace], ranked[-self.replace :]
        target = round_ * self.interval
        for slot in bottom:
            if slot in top:
                continue
            rng = _rng(self.seed, round_, slot)
            donor = top[rng.randrange(len(top))]
            if not scores[donor] > scores[slot]:
                continue
            parent = self.run_in(donor, round_)
            child = member_run(self.name, slot, round_)
            pcfg = validate(self.ledger.get_run(parent).config)
            lr = pcfg.lr * rng.choice((DOWN, UP))
            sigma = pcfg.sigma * rng.choice((DOWN, UP))
            if not self.ledger.has_run(child):
                session.fork(self.ledger, f"{parent}@{target}", child,
                             [override("lr", lr), override("sigma", sigma)], 0, trust_code=self.check_code(parent))
            if _event(self.ledger, child, "pbt-exploit") is None:
                payload = {"pbt": self.name, "round": round_, "slot": slot, "from": f"{parent}@{target}",
                           "from_score": scores[donor], "replaced": self.run_in(slot, round_),
                           "replaced_score": scores[slot], "lr": lr, "sigma": sigma}
                self.ledger.log_event(child, "pbt-exploit", payload)
                self.say({"event": "exploit", **payload, "run": child})

    @contextlib.contextmanager
    def _ray(self) -> Iterator[None]:
        """With `workers.pool: ray`, join (or start) Ray once for the whole study: every
        member's pool (at its creation, for the base fingerprint; in each round) then uses
        that connection instead of starting and stopping a local cluster of its own."""
        if self.cfg.workers.pool != "ray":
            yield
            return
        from seedledger.engine.runtime.pools.ray_setup import connect, ray

        owned = connect(self.cfg.workers.address)
        try:
            yield
        finally:
            if owned:
                ray.shutdown()

    def run(self) -> dict[str, Any]:
        for run, slot, round_ in self.existing_runs():  # before anything is built from a stored config
            self.check_code(run)
            self.check_config(run, slot, round_)
        history = []
        # every member's sessions record the config's sha256; on Ray, one cluster for the study
        with reading(self.config), self._ray():
            self.start()
            for round_ in range(1, self.R + 1):
                self.train_round(round_)
                scores = self.scores(round_)
                history.append({"round": round_, "generation": round_ * self.interval,
                                "runs": [self.run_in(s, round_) for s in range(self.K)], "scores": scores})
                if round_ < self.R:
                    self.exploit(round_, scores)
        last = history[-1]
        best = max(range(self.K), key=lambda s: (last["scores"][s], -s))
        return {**self.settings, "rounds_done": history,
                "best": {"run": last["runs"][best], "generation": last["generation"],
                         "score": last["scores"][best]}}


def _train_on_ray(location: str, todo: list[tuple[str, int]], trust_code: bool, study: str) -> None:
    """A round's members as Ray tasks; each session builds its own (Ray) pool, whose actors
    hold the CPUs, so the tasks ask for none. Each records `study` (the config) among its inputs."""
    from seedledger.engine.runtime.pools.ray_setup import get, ray  # connected by PBT.run, for the whole study

    @ray.remote(num_cpus=0, max_retries=0)
    def train(location: str, run: str, generations: int, trust_code: bool, study: str) -> str:
        from seedledger.engine.runtime import session as remote_session
        from seedledger.engine.runtime.setup.inputs import reading as remote_reading
        from seedledger.ledger import Ledger as RemoteLedger

        with RemoteLedger.open(location, create=False) as led, remote_reading(study):
            return remote_session.resume(led, run, generations, trust_code=trust_code).fingerprint

    for ref in [train.remote(location, run, n, trust_code, study) for run, n in todo]:
        get(ref)
