"""What a rebuild replays: generation 0 of a run (`Start`, `load_start`) and the `Source`
record a ledger reference (`RunSource`) or a seed file (`FileSource`) resolves to. Each
kind says how it replays, checks its base and adds a member; engine.rebuild.rebuilding resolves
SOURCE to one of them and builds every kind the same way."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from seedledger.engine.refs import resolve_member
from seedledger.engine.runtime.dirs import anchors_dir
from seedledger.engine.runtime.models.resolve import resolve_model
from seedledger.ledger import Ledger, RunInfo
from seedledger.ledger.db import sqlite_path, to_url
from seedledger.ledger.errors import SeedLedgerError, VerifyMismatch
from seedledger.replay.adapter import LoraSpec, start_fingerprint
from seedledger.replay.kinds import Full, PerturbationKind, from_run
from seedledger.replay.kinds.forms import MasterForm
from seedledger.replay.noise import member_key
from seedledger.replay.rebuild import apply_member, rebuild, replay_steps
from seedledger.replay.rules import check_lineage_rules
from seedledger.replay.update import OptimizerState


def add_member(ledger: Ledger, run: str, g: int, index: int, master: dict[str, torch.Tensor],
               state: OptimizerState | None = None) -> None:
    """Turn `master` (the weights at `run@g-1`) into member `index` of `run@g`, in place:
    the weights it was evaluated with (`replay.rebuild.apply_member`, in the generation's
    perturbation kind; a member of a `paths` generation also needs `state`, the replay state at
    `run@g-1`). One place for `rebuild`, `diff` and the API."""
    m = ledger.generation(run, g).members[index]
    apply_member(master, ledger.replay_history(run, upto=g)[-1], m.key, m.sign, member=index, state=state)


def load_base_master(model_dir: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The base weights as an fp32 master, named as `named_parameters()` names them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, local_files_only=True, use_safetensors=True  # never a pickle
    )
    return {
        name: p.detach().to(device=device, dtype=torch.float32).contiguous()
        for name, p in model.named_parameters()
    }


@dataclass
class Start:
    """Generation 0 of a run: the master replay starts from, and for an adapter run the
    frozen base it rides on."""

    model_dir: Path
    master: dict[str, torch.Tensor]  # the base weights, or the initial adapter
    adapter: LoraSpec | None = None
    frozen: str | None = None  # the frozen base's fingerprint, as loaded
    model: Any = None  # the frozen base as loaded (merging needs its weights)
    quantization: str = "none"
    kind: PerturbationKind = field(default_factory=Full)  # what the run's strings name

    @property
    def fingerprint(self) -> str:
        return start_fingerprint(self.master, self.frozen)


def load_start(base: str, config: dict, noise_spec: str, param_selection: str, device: str = "cpu") -> Start:
    """Generation 0 of a run with this stored config and perturbation, on the model `base`
    (alias or directory), where its kind's `master_form` says the master lives: the model's
    weights, or an adapter on a frozen base loaded as the run's `base_quantization` says,
    whose initial adapter and fingerprint the HF backend's own master store makes
    (`hf_master.AdapterOnBase`), so rebuild and training cannot start apart."""
    from seedledger.engine.config import validate
    from seedledger.engine.runtime.backends.hf_master import AdapterOnBase
    from seedledger.engine.runtime.models.resolve import load_causal_lm

    if base.startswith(("module:", "in-process:")):  # engine.rebuild.module_start makes those
        raise SeedLedgerError(f"{base!r} names a torch.nn.Module run's model: rebuild and verify replay it "
                              "(engine.rebuild.module_start); this command reads language models")
    model_dir = resolve_model(base)
    kind = from_run(noise_spec, param_selection)
    if kind.master_form is MasterForm.MODEL:
        return Start(model_dir, load_base_master(model_dir, device), kind=kind)
    cfg = validate(config, "the run's config")
    model = load_causal_lm(model_dir, device=device, quantization=cfg.base_quantization)
    init = getattr(cfg.train, "init", None)  # a LoRA run's PEFT directory, else None
    store = AdapterOnBase(model, kind, quantization=cfg.base_quantization, adapter_init=init, keep_fp32=False)
    return Start(model_dir, store.initial(), kind.adapter, store.frozen, model, cfg.base_quantization, kind)


@dataclass
class Source:
    """What one rebuild replays, as read from a ledger reference or a seed file and not yet
    replayed: one record, so that one builder (`build_master`) serves both. `upto` is the
    generation replayed; a member (`RUN@G#M`, a format-3 file) adds its perturbation."""

    what: str  # how messages name it: the reference as given, or the file's path
    lineage: str  # what --allow-unverified is about: RUN@G-1 for a member, or the file
    run: str
    generation: int  # the generation the source names (a member's own)
    upto: int
    member: int | None
    base_model: str
    config: dict
    noise_spec: str
    param_selection: str
    base_fingerprint: str | None
    keep: Path | None  # the ledger's file: an output never replaces a directory holding it
    final_fingerprint: str | None = None  # what the file says `upto` replays to

    def fingerprints(self) -> dict[int, str | None]:
        raise NotImplementedError

    def steps(self) -> list:
        raise NotImplementedError

    def check_rules(self) -> None:
        """Refuse a step whose update rule its run's config cannot record (replay.rules). A
        seed file's steps are not judged: it flattens a lineage whose forks may have changed
        the rule, and names no segment's config but the last."""

    def check_base(self, start: Start, base: str | None) -> None:
        raise NotImplementedError

    def replay(self, start: Start, verify: str) -> tuple[dict[str, torch.Tensor], OptimizerState]:
        raise NotImplementedError

    def add_member(self, master: dict[str, torch.Tensor], state: OptimizerState) -> None:
        raise NotImplementedError

    def parent_fingerprint(self, fps: dict[int, str | None]) -> str | None:
        raise NotImplementedError


@dataclass
class RunSource(Source):
    """`RUN@G` or `RUN@G#M` of an open ledger, replayed from the nearest anchor."""

    ledger: Ledger | None = None

    @classmethod
    def of(cls, ledger: Ledger, run: RunInfo, gen: int, member: int | None = None,
           what: str | None = None) -> RunSource:
        upto = gen if member is None else gen - 1
        return cls(what or f"{run.name}@{gen}", f"{run.name}@{upto}", run.name, gen, upto, member,
                   run.base_model, run.config, run.noise_spec, run.param_selection, run.base_fingerprint,
                   sqlite_path(to_url(ledger.location)), ledger=ledger)

    @classmethod
    def resolve(cls, ledger: Ledger, ref: str) -> RunSource:
        return cls.of(ledger, *resolve_member(ledger, ref), what=ref)

    def fingerprints(self) -> dict[int, str | None]:
        return self.ledger.fingerprints(self.run, self.upto)

    def steps(self) -> list:
        return self.ledger.replay_history(self.run, upto=self.upto)

    def check_rules(self) -> None:
        check_lineage_rules(self.ledger, self.steps())

    def check_base(self, start: Start, base: str | None) -> None:
        if not self.base_fingerprint or start.fingerprint == self.base_fingerprint:
            return
        what = "base"
        on_adapter = start.kind.master_form is MasterForm.ADAPTER
        if on_adapter:
            what = f"base (loaded with base_quantization {start.quantization}, with the initial adapter)"
        if on_adapter and start.adapter.essa:
            raise SeedLedgerError(
                f"{self.run}: the frozen base with the ESSA basis factored here from {self.config['train']['init']} "
                "does not have the run's fingerprint: another base, or a LAPACK build that factors B·A "
                "differently in the last bit (rebuild where the run was trained)")
        raise SeedLedgerError(
            f"{what} {base or self.base_model!r} is not the model {self.run} was trained from "
            "(fingerprint differs); pass the right one with --base"
        )

    def replay(self, start: Start, verify: str) -> tuple[dict[str, torch.Tensor], OptimizerState]:
        return rebuild(self.ledger, self.run, self.upto, start.master, verify=verify,
                       anchors_dir=anchors_dir(self.ledger), frozen=start.frozen)

    def add_member(self, master: dict[str, torch.Tensor], state: OptimizerState) -> None:
        add_member(self.ledger, self.run, self.generation, self.member, master, state)

    def parent_fingerprint(self, fps: dict[int, str | None]) -> str | None:
        return fps[self.upto] if self.upto else self.base_fingerprint


@dataclass
class FileSource(Source):
    """A seed file alone: its header names the base, the trained parameters and every step."""

    seeds: Any = None

    @classmethod
    def read(cls, path: Path, keep: Path | None = None) -> FileSource:
        from seedledger.engine.rebuild.seedcheck import check_seedfile
        from seedledger.ledger.seedfile import read_seedfile

        seeds = read_seedfile(path, key_fn=member_key, check=check_seedfile)
        h, m = seeds.header, seeds.member
        return cls(str(path), str(path), h["run"], seeds.generation if m is None else m.generation,
                   seeds.generation, None if m is None else m.index, seeds.base_model, h["config"],
                   h["noise_spec"], h["param_selection"], seeds.base_fingerprint, keep,
                   seeds.final_fingerprint, seeds=seeds)

    def fingerprints(self) -> dict[int, str | None]:
        return {s.index: fp for s, fp in zip(self.seeds.steps, self.seeds.fingerprints, strict=True)}

    def steps(self) -> list:
        return self.seeds.steps

    def check_base(self, start: Start, base: str | None) -> None:
        if self.base_fingerprint is not None and start.fingerprint != self.base_fingerprint:
            from seedledger.engine.runtime.models.provenance import describe, how_to_get

            made_on = self.seeds.base_provenance  # what the file says its base is, when it does
            get = (f": {describe(made_on)}; get it with {how_to_get(made_on)}" if made_on is not None
                   else "; pass the right one with --base")
            raise SeedLedgerError(
                f"{self.what}: base {base or self.base_model!r} has fingerprint {start.fingerprint[:16]}…, "
                f"but the seed file was made on {self.base_model!r} with fingerprint "
                f"{self.base_fingerprint[:16]}…{get}"
            )

    def replay(self, start: Start, verify: str) -> tuple[dict[str, torch.Tensor], OptimizerState]:
        expected = self.fingerprints() if verify == "every" else None
        try:
            return replay_steps(start.master, self.seeds.steps, expected=expected)
        except VerifyMismatch as exc:
            raise VerifyMismatch(f"{self.what}: {exc}") from None

    def add_member(self, master: dict[str, torch.Tensor], state: OptimizerState) -> None:
        m = self.seeds.member
        apply_member(master, m.step(), m.key, m.sign)

    def parent_fingerprint(self, fps: dict[int, str | None]) -> str | None:
        return self.final_fingerprint if self.upto else self.base_fingerprint
