"""trainers.settings.TrainSettings is what trainers read of the engine's TrainConfig: every
member exists on a validated config (and each section protocol on its section), and no
trainer reads the config outside it, so the protocol and the config cannot drift apart."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Protocol

from seedledger.engine.config import TrainConfig, validate
from seedledger.engine.config_sections import CurriculumConfig, KLConfig, PassKConfig, Schedules
from seedledger.trainers.policy import ALGORITHMS
from seedledger.trainers.settings import (
    CurriculumSettings,
    KLSettings,
    PassKSettings,
    RequirementSettings,
    ScheduleSettings,
    TrainSettings,
)

TRAINERS = Path(__file__).resolve().parent.parent / "trainers"
SECTIONS = {KLSettings: KLConfig, CurriculumSettings: CurriculumConfig, PassKSettings: PassKConfig,
            ScheduleSettings: Schedules}
ALGORITHM_SECTIONS = {cls.settings for cls in ALGORITHMS.values() if cls.settings}


def members(protocol: type) -> set[str]:
    """The names a protocol declares, its protocol bases' included."""
    return {name for cls in protocol.__mro__ if Protocol in cls.__bases__ or cls is protocol
            for name in vars(cls) if not name.startswith("_")}


def test_a_validated_config_has_every_member():
    cfg = validate({})
    missing = sorted(name for name in members(TrainSettings) if not hasattr(cfg, name))
    assert not missing, f"TrainSettings lists attributes TrainConfig lacks: {missing}"
    assert members(RequirementSettings) <= members(TrainSettings)
    assert callable(cfg.capabilities) and callable(cfg.perturbation_type)
    assert isinstance(cfg.capabilities(), frozenset) and cfg.perturbation_type().label == "full"


def test_each_section_protocol_fits_its_config_section():
    for protocol, section in SECTIONS.items():
        missing = sorted(members(protocol) - set(section.model_fields))
        assert not missing, f"{protocol.__name__} lists fields {section.__name__} lacks: {missing}"
    assert isinstance(validate({}).schedule, Schedules)
    for name, section in (("kl", KLConfig), ("curriculum", CurriculumConfig), ("passk", PassKConfig)):
        assert section in _types(TrainConfig.model_fields[name].annotation), name


def _types(annotation: object) -> set[object]:
    return {annotation, *getattr(annotation, "__args__", ())}


def test_every_algorithm_section_is_a_config_key():
    """Algorithms read their own section by name (getattr), outside the protocol."""
    assert ALGORITHM_SECTIONS and ALGORITHM_SECTIONS <= set(TrainConfig.model_fields)
    cfg = validate({})
    assert all(getattr(cfg, name) is None for name in ALGORITHM_SECTIONS)


PROTOCOLS = {p.__name__: members(p) for p in (TrainSettings, RequirementSettings, *SECTIONS)}


def reads(tree: ast.AST) -> dict[str, set[str]]:
    """protocol name -> attributes read of a parameter annotated with it (`p.x`, `getattr(p, "x")`)."""
    found: dict[str, set[str]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        typed = {arg.arg: n.id for arg in fn.args.args + fn.args.kwonlyargs if arg.annotation
                 for n in ast.walk(arg.annotation) if isinstance(n, ast.Name) and n.id in PROTOCOLS}
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in typed:
                found.setdefault(typed[node.value.id], set()).add(node.attr)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr") and isinstance(node.args[0], ast.Name)
                  and node.args[0].id in typed and isinstance(node.args[1], ast.Constant)):
                found.setdefault(typed[node.args[0].id], set()).add(node.args[1].value)
    return found


def test_trainers_read_nothing_outside_the_protocol():
    outside, scanned = {}, set()
    for path in sorted(TRAINERS.rglob("*.py")):
        for protocol, names in reads(ast.parse(path.read_text(), filename=str(path))).items():
            scanned.add(protocol)
            extra = names - PROTOCOLS[protocol] - (ALGORITHM_SECTIONS if protocol == "TrainSettings" else set())
            if extra:
                outside[f"{path.relative_to(TRAINERS)} ({protocol})"] = sorted(extra)
    assert {"TrainSettings", "RequirementSettings", "KLSettings"} <= scanned, f"the scan is broken: {scanned}"
    assert not outside, f"trainers read attributes their protocol does not list: {outside}"


def test_no_trainer_takes_the_config_as_any():
    untyped = []
    for path in sorted(TRAINERS.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(fn, ast.FunctionDef):
                untyped += [f"{path.name}:{fn.lineno} {fn.name}" for arg in fn.args.args
                            if arg.arg == "cfg" and isinstance(arg.annotation, ast.Name) and arg.annotation.id == "Any"]
    assert not untyped, f"config parameters typed Any (use trainers.settings.TrainSettings): {untyped}"
