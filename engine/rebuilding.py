"""Rebuild and verify: base model in, replayed weights out (the CLI and engine.api).

The replay arithmetic is `replay.rebuild`; this module adds what replay must not know:
where the base model comes from, and how a Hugging Face directory is written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seedledger.engine.models import resolve_model
from seedledger.engine.rebuild_memory import check_rebuild_memory
from seedledger.engine.refs import parse_ref, resolve_member, resolve_ref, split_member
from seedledger.engine.session import anchors_dir
from seedledger.ledger import Ledger
from seedledger.ledger.db import sqlite_path, to_url
from seedledger.ledger.durable import (
    as_umask_allows,
    disk_full,
    holds_ledger,
    is_sqlite_file,
    write_error,
)
from seedledger.ledger.errors import NotVerified, SeedLedgerError, VerifyMismatch
from seedledger.ledger.records import missing_fingerprint
from seedledger.replay.adapter import LoraSpec, start_fingerprint
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.noise import member_key
from seedledger.replay.perturbation import check_spec
from seedledger.replay.rebuild import apply_member, rebuild, replay_steps
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

    @property
    def fingerprint(self) -> str:
        return start_fingerprint(self.master, self.frozen)


def load_start(base: str, config: dict, noise_spec: str, param_selection: str, device: str = "cpu") -> Start:
    """Generation 0 of a run with this stored config and perturbation, on the model `base`
    (alias or directory): an adapter run loads its frozen base as the run's
    `base_quantization` says and makes (or reads) its initial adapter."""
    from seedledger.engine import adapters
    from seedledger.engine.config import validate
    from seedledger.engine.models import load_causal_lm

    model_dir = resolve_model(base)
    spec = check_spec(noise_spec, param_selection).adapter
    if spec is None:
        return Start(model_dir, load_base_master(model_dir, device))
    cfg = validate(config, "the run's config")
    model = load_causal_lm(model_dir, device=device, quantization=cfg.base_quantization)
    init = cfg.train.init if cfg.train != "full" else None
    return Start(model_dir, adapters.initial_adapter(model, spec, init), spec,
                 adapters.frozen_fingerprint(model), model, cfg.base_quantization)


MARKER = "seedledger.json"  # written into every rebuild output: its run, generation, fingerprint


def is_rebuild_output(path: Path) -> bool:
    """True when `path` is a directory an earlier `seedledger rebuild` wrote."""
    try:
        meta = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and {"run", "generation", "fingerprint"} <= meta.keys()


def check_output(output: Path, force: bool = False, keep: Path | None = None) -> None:
    """Refuse an output that would destroy something seedledger did not write: an existing
    file, a non-empty directory that is not an earlier rebuild's output (unless `force`),
    and, even with `force`, the current directory, one of its parents, a directory that
    holds `keep` (the ledger) or any SQLite database. Called before any work, so a
    refusal costs nothing."""
    target = output.expanduser().resolve()
    if not target.exists():
        return
    if not target.is_dir():
        ledger = " (an SQLite database: a ledger is never written over)" if holds_ledger(target) else ""
        raise SeedLedgerError(f"-o {output}: exists and is not a directory{ledger}")
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise SeedLedgerError(f"-o {output}: refusing to replace the current directory or a parent of it")
    if keep is not None and target in keep.expanduser().resolve().parents:
        raise SeedLedgerError(f"-o {output}: refusing to replace a directory that holds the ledger {keep}")
    found = _sqlite_file_in(target)
    if found is not None:
        raise SeedLedgerError(
            f"-o {output}: refusing to replace a directory that holds an SQLite database ({found})"
        )
    if force or is_rebuild_output(target) or not any(target.iterdir()):
        return
    raise SeedLedgerError(
        f"-o {output}: directory is not empty and is not an earlier rebuild's output "
        f"(no {MARKER}); pick another directory or pass --force to replace it"
    )


def _sqlite_file_in(directory: Path) -> Path | None:
    """The first SQLite database (a ledger, perhaps) under `directory`, links not followed."""
    for root, _dirs, files in os.walk(directory):
        for name in files:
            if is_sqlite_file(Path(root, name), follow_symlinks=False):
                return Path(root, name)
    return None


def model_from_master(base_dir: Path, master: dict[str, torch.Tensor]) -> Any:
    """The base model's transformers model (in its own dtype) holding `master`'s weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto", local_files_only=True, use_safetensors=True)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(master[name].to(device=param.device, dtype=param.dtype))
    return model


def merged_weights(start: Start, master: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every weight of the model `master` stands for: itself for a full run; for an adapter
    run the base with the adapter merged in (an int8 base dequantized first, since
    re-quantizing would round the adapter away)."""
    if start.adapter is None:
        return master
    from seedledger.engine import adapters

    modules = list(adapters.target_linears(start.model, start.adapter))
    return adapters.merge(adapters.dequantized(start.model), master, start.adapter, modules)


def write_model_dir(
    base_dir: Path, master: dict[str, torch.Tensor], output: Path, meta: dict,
    force: bool = False, keep: Path | None = None,
) -> None:
    """Write a transformers/vLLM-loadable directory in the base model's own dtype."""
    from transformers import AutoTokenizer

    model = model_from_master(base_dir, master)

    def fill(staging: Path) -> None:
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(base_dir).save_pretrained(staging)

    publish(output, fill, meta, force, keep)


def write_output(start: Start, master: dict[str, torch.Tensor], output: Path, meta: dict, *,
                 merge: bool = False, force: bool = False, keep: Path | None = None) -> dict:
    """The rebuilt model at `output`: a model directory, or for an adapter run a PEFT
    adapter directory (`merge`: the base with the adapter merged in, fp32; an int8 base
    is dequantized first, since re-quantizing would round the adapter away). Returns
    what the report adds."""
    if start.adapter is None:
        if merge:
            raise SeedLedgerError(f"{meta['run']} trains every weight: there is no adapter to --merge")
        write_model_dir(start.model_dir, master, output, meta, force, keep)
        return {}
    from seedledger.engine import adapters

    meta = {**meta, "adapter": start.adapter.selection, "base_quantization": start.quantization}
    if merge:
        write_model_dir(start.model_dir, merged_weights(start, master), output, {**meta, "merged": True}, force, keep)
        return {"format": "merged"}
    publish(output, lambda staging: adapters.write_peft_dir(staging, master, start.adapter, str(start.model_dir)),
            meta, force, keep)
    return {"format": "peft"}


def publish(output: Path, fill: Callable[[Path], None], meta: dict, force: bool = False,
            keep: Path | None = None) -> None:
    """Write a directory atomically: `fill` writes it beside `output` under a temporary
    name, the marker goes in, and it is renamed into place, so `output` is never
    half-written; what stood there before (an earlier rebuild, or anything with `force`)
    is moved aside first and removed after. Callers run `check_output` before their
    expensive work; it runs again here just before the rename, for anything that
    appeared meanwhile."""
    output = output.expanduser().resolve()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    except OSError as exc:  # a read-only place, a file where a directory should be
        raise SeedLedgerError(f"-o {output}: cannot write in {output.parent}: {exc.strerror}") from None
    old = None
    try:
        try:
            fill(staging)
            (staging / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        except Exception as exc:  # a full disk: one line, and the staging directory goes
            if isinstance(exc, OSError) or disk_full(exc):
                raise write_error(f"-o {output}", exc) from None
            raise
        as_umask_allows(staging)  # mkdtemp's 0700 and safetensors' 0600 are not for sharing
        check_output(output, force, keep)  # again: something may have appeared meanwhile
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old.", dir=output.parent))
            output.rename(old / "previous")
        try:
            staging.rename(output)
        except OSError:
            if old is not None:
                (old / "previous").rename(output)  # put it back
            raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
        if old is not None and old.exists():
            shutil.rmtree(old)


def _base_for(run, base: str | None, device: str) -> Start:
    start = load_start(base or run.base_model, run.config, run.noise_spec, run.param_selection, device)
    if run.base_fingerprint and start.fingerprint != run.base_fingerprint:
        what = "base"
        if start.adapter is not None:
            what = f"base (loaded with base_quantization {start.quantization}, with the initial adapter)"
        if start.adapter is not None and start.adapter.essa:
            raise SeedLedgerError(
                f"{run.name}: the frozen base with the ESSA basis factored here from {run.config['train']['init']} "
                "does not have the run's fingerprint: another base, or a LAPACK build that factors B·A "
                "differently in the last bit (rebuild where the run was trained)")
        raise SeedLedgerError(
            f"{what} {base or run.base_model!r} is not the model {run.name} was trained from "
            "(fingerprint differs); pass the right one with --base"
        )
    return start


def _fits(what: str, base: str, noise_spec: str, param_selection: str, steps: list) -> None:
    """Refuse, before the base is loaded, a replay of `steps` that needs more memory than
    the bound (`engine.rebuild_memory`): a planted file's paths each cost a copy of the model."""
    adapter = check_spec(noise_spec, param_selection).adapter
    check_rebuild_memory(what, resolve_model(base), [s.optimizer for s in steps], adapter)


def _unchecked(missing: tuple[int, str] | None, what: str, allow_unverified: bool) -> dict:
    """The report's `verified` fields; NotVerified (exit 1) when nothing checks `what` and
    the user did not pass --allow-unverified."""
    if missing is None:
        return {"verified": True}
    if not allow_unverified:
        raise NotVerified(
            f"{what} could not be verified: {missing[1]}; pass --allow-unverified to rebuild it anyway"
        )
    return {"verified": False, "not_verified": missing[1]}


def _with_event(ledger: Ledger, run: str, payload: dict, report: dict) -> dict:
    """`report`, after recording `payload` as the run's `verify` event; when the ledger
    cannot take it (read-only), the result still stands and `event_error` says why."""
    try:
        ledger.log_event(run, "verify", payload)
    except SeedLedgerError as exc:
        report["event_error"] = str(exc)
    return report


def verify_ref(ledger: Ledger, ref: str, device: str = "cpu") -> dict:
    """Replay from the base (no anchors) and compare every generation's fingerprint.

    Every outcome is logged as a `verify` event (where the ledger can be written: else the
    report's `event_error` says so); a mismatch, or a base or generation with no
    fingerprint to compare against ("not verified"), is reported (`ok: false`, the first
    generation concerned, the message), not raised, so that the CLI can print the report
    before it exits 1.
    """
    run, gen = resolve_ref(ledger, ref)
    missing = missing_fingerprint(run.base_fingerprint, ledger.fingerprints(run.name, gen))
    if missing is not None:
        bad, why = missing
        message = f"{run.name}@{gen} not verified: {why}"
        return _with_event(
            ledger, run.name,
            {"generation": gen, "ok": False, "device": device, "first_bad_generation": bad,
             "error": message, "not_verified": why},
            {
                "run": run.name,
                "generation": gen,
                "generations_checked": 0,
                "first_bad_generation": bad,
                "fingerprint": None,
                "ok": False,
                "not_verified": why,
                "error": message,
            },
        )
    _fits(f"{run.name}@{gen}", run.base_model, run.noise_spec, run.param_selection,
          ledger.replay_history(run.name, upto=gen))
    start = _base_for(run, None, device)
    try:
        master, _ = rebuild(ledger, run.name, gen, start.master, verify="every", anchors_dir=None,
                            frozen=start.frozen)
    except VerifyMismatch as exc:
        bad = exc.generation
        message = f"{run.name}@{gen} does not verify: {exc}"
        return _with_event(
            ledger, run.name,
            {"generation": gen, "ok": False, "device": device, "first_bad_generation": bad,
             "error": str(exc)},
            {
                "run": run.name,
                "generation": gen,
                "generations_checked": bad,
                "first_bad_generation": bad,
                "fingerprint": None,
                "ok": False,
                "error": message,
            },
        )
    fp = fingerprint(master)
    return _with_event(
        ledger, run.name, {"generation": gen, "ok": True, "device": device, "fingerprint": fp},
        {"run": run.name, "generation": gen, "generations_checked": gen, "fingerprint": fp, "ok": True},
    )


def ref_master(
    ledger: Ledger, ref: str, base: str | None = None, device: str = "cpu",
    *, verify: str = "end", allow_unverified: bool = False,
) -> tuple[Start, dict[str, torch.Tensor], dict, dict]:
    """The fp32 master at `RUN@G` in memory: (its start, the master, meta, the report's
    `verified` fields). `RUN@G#M` is `RUN@G-1` (checked against its fingerprint) plus
    member M's perturbation, the weights that member was evaluated with
    (`replay.rebuild.apply_member`). Shared by `rebuild -o DIR` and the Python API."""
    run, gen, member = resolve_member(ledger, ref)
    upto = gen if member is None else gen - 1
    fps = ledger.fingerprints(run.name, upto)
    wanted = fps if verify == "every" else {g: fp for g, fp in fps.items() if g == upto}
    checked = _unchecked(missing_fingerprint(run.base_fingerprint, wanted), f"{run.name}@{upto}", allow_unverified)
    _fits(ref, base or run.base_model, run.noise_spec, run.param_selection,
          ledger.replay_history(run.name, upto=upto))
    start = _base_for(run, base, device)
    master, state = rebuild(ledger, run.name, upto, start.master, verify=verify,
                            anchors_dir=anchors_dir(ledger), frozen=start.frozen)
    meta: dict = {"run": run.name, "generation": gen}
    if member is not None:
        add_member(ledger, run.name, gen, member, master, state)
        meta |= {"member": member, "parent_fingerprint": fps[upto] if upto else run.base_fingerprint}
    fp = fingerprint(master)
    meta |= {"fingerprint": fp, "base_model": run.base_model}
    return start, master, meta, checked


def rebuild_ref(
    ledger: Ledger, ref: str, output: Path, base: str | None, device: str,
    *, verify: str = "end", force: bool = False, allow_unverified: bool = False, merge: bool = False,
) -> dict:
    """Write the model at `RUN@G` or `RUN@G#M` (`ref_master`) to `output`."""
    resolve_member(ledger, ref)  # a bad reference is reported before the output is judged
    keep = sqlite_path(to_url(ledger.location))
    check_output(output, force, keep)
    start, master, meta, checked = ref_master(ledger, ref, base, device, verify=verify,
                                              allow_unverified=allow_unverified)
    written = write_output(start, master, output, meta, merge=merge, force=force, keep=keep)
    return {**meta, **written, "output": str(output), "verify": verify, **checked}


def seedfile_master(
    path: Path, base: str | None = None, device: str = "cpu",
    *, verify: str = "end", allow_unverified: bool = False, before: Callable[[], None] | None = None,
) -> tuple[Start, dict[str, torch.Tensor], dict, dict]:
    """The fp32 master a seed file describes, in memory (its header names the base, the
    trained parameters and every step): as `ref_master`; a member file (format 3) gives
    its last generation's master (checked) plus the member's perturbation, as `RUN@G#M`
    does. `before` runs once the file is read, before any work."""
    from seedledger.ledger.seedfile import read_seedfile
    from seedledger.replay.seedcheck import check_seedfile

    seeds = read_seedfile(path, key_fn=member_key, check=check_seedfile)
    if before is not None:
        before()
    fps = {s.index: fp for s, fp in zip(seeds.steps, seeds.fingerprints, strict=True)}
    wanted = fps if verify == "every" else {g: fp for g, fp in fps.items() if g == seeds.generation}
    checked = _unchecked(missing_fingerprint(seeds.base_fingerprint, wanted), str(path), allow_unverified)
    h = seeds.header
    _fits(str(path), base or seeds.base_model, h["noise_spec"], h["param_selection"], seeds.steps)
    start = load_start(base or seeds.base_model, h["config"], h["noise_spec"], h["param_selection"], device)
    if seeds.base_fingerprint is not None and start.fingerprint != seeds.base_fingerprint:
        raise SeedLedgerError(
            f"{path}: base {base or seeds.base_model!r} has a different fingerprint than the "
            "seed file's base; pass the right one with --base"
        )
    try:
        master, _ = replay_steps(start.master, seeds.steps, expected=fps if verify == "every" else None)
    except VerifyMismatch as exc:
        raise VerifyMismatch(f"{path}: {exc}") from None
    fp = fingerprint(master)
    if seeds.final_fingerprint is not None and fp != seeds.final_fingerprint:
        raise VerifyMismatch(f"{path}: rebuilt fingerprint {fp} differs from the file's {seeds.final_fingerprint}")
    meta: dict = {"run": seeds.header["run"], "generation": seeds.generation}
    if seeds.member is not None:  # RUN@G#M: the checked RUN@G-1 plus the member's perturbation
        m = seeds.member
        apply_member(master, m.step(), m.key, m.sign)
        meta = {**meta, "generation": m.generation, "member": m.index,
                "parent_fingerprint": seeds.final_fingerprint if seeds.generation else seeds.base_fingerprint}
        fp = fingerprint(master)
    meta |= {"fingerprint": fp, "base_model": seeds.base_model}
    return start, master, meta, checked


def rebuild_seedfile(
    path: Path, output: Path, base: str | None, device: str,
    *, verify: str = "end", force: bool = False, keep: Path | None = None,
    allow_unverified: bool = False, merge: bool = False,
) -> dict:
    """Rebuild from a seed file alone (`seedfile_master`) into `output`."""
    start, master, meta, checked = seedfile_master(
        path, base, device, verify=verify, allow_unverified=allow_unverified,
        before=lambda: check_output(output, force, keep=keep),
    )
    written = write_output(start, master, output, meta, merge=merge, force=force, keep=keep)
    return {**meta, **written, "output": str(output), "verify": verify, **checked}


def rebuild_source(
    ledger_location: str, source: str, output: Path, base: str | None, device: str,
    *, verify: str = "end", force: bool = False, upgrade: bool = True,
    allow_unverified: bool = False, merge: bool = False,
) -> dict:
    """`seedledger rebuild SOURCE`: a run (RUN or RUN@G) when the ledger has one by that
    name, else a seed file; both at once is refused as ambiguous (write ./FILE for the file)."""
    ledger_file = sqlite_path(to_url(ledger_location))
    has_ledger = ledger_file is None or ledger_file.exists()
    is_file = Path(source).is_file()
    if "#" in source and not is_file:
        split_member(source)  # a malformed RUN@G#M: say what is wrong with it
    run_name = _run_part(source)
    led = None
    if has_ledger and (run_name is not None or not is_file):
        try:
            led = Ledger.open(ledger_location, upgrade=upgrade, create=False)
        except SeedLedgerError:
            if not is_file:
                raise  # a seed file needs no ledger: one that cannot be opened is no run
    try:
        is_run = led is not None and run_name is not None and led.has_run(run_name)
        if is_run and is_file:
            raise SeedLedgerError(
                f"{source!r} is both a run in {ledger_location} and a file; "
                f"write ./{source} for the file"
            )
        if is_run:
            return rebuild_ref(
                led, source, output, base, device,
                verify=verify, force=force, allow_unverified=allow_unverified, merge=merge,
            )
        if is_file:
            return rebuild_seedfile(
                Path(source), output, base, device,
                verify=verify, force=force, keep=ledger_file, allow_unverified=allow_unverified, merge=merge,
            )
        where = f"in {ledger_location}" if has_ledger else f"(no ledger at {ledger_location})"
        raise SeedLedgerError(f"{source!r} is neither a run {where} nor a seed file")
    finally:
        if led is not None:
            led.close()


def _run_part(source: str) -> str | None:
    """The run name of `source` read as RUN or RUN@G; None when it cannot be one."""
    try:
        name, _ = parse_ref(split_member(source)[0])
    except SeedLedgerError:
        return None
    return name


def quick_report(led: Ledger, ref: str) -> dict:
    """`verify --quick`: the hash chain of RUN@G's lineage, recomputed from the rows (no
    model, no replay); a `verify` event records the outcome either way."""
    from seedledger.ledger.errors import ChainBroken

    run, gen = resolve_ref(led, ref)
    report = {"run": run.name, "generation": gen, "quick": True}
    try:
        digest, checked = led.check_chain(run.name, gen)
    except ChainBroken as exc:
        report |= {"ok": False, "generations_checked": 0, "first_bad_generation": exc.generation,
                   "error": f"{run.name}@{gen} does not verify: {exc}"}
    else:
        report |= {"ok": True, "generations_checked": checked, "digest": digest}
    led.log_event(run.name, "verify", {k: v for k, v in report.items() if k != "run"})
    return report
