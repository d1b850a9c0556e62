"""Model loading: the embedded Gemma 3 270M (converted once from its GGUF and cached,
``embedded_model.py``), a dev model (``devmodel.py``), a local folder, or a hub name.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..embedded import EMBEDDED, default_cache_dir
from ..formats import looks_instruction_tuned
from .embedded_model import EMBEDDED_NAME, embedded_model_dir
from .int8head import Int8Head
from .int8head import prepare as prepare_head
from .packed import pack_model
from .precision import Packing, Precision, pick_precision

log = logging.getLogger("wschat.loader")


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    processor: Any | None
    name: str
    device: str
    dtype: torch.dtype  # of the activations and the KV cache
    # Tuned on chat turns (engine/formats.py's ``auto`` renders its conversations as turns).
    instruction_tuned: bool = False
    # How the weights are held, as --dtype names it (precision.py); the dtype's name if unset
    precision: str = ""
    cache_dir: Path | None = None  # where compiled kernels are cached (under inductor/)

    @property
    def precision_name(self) -> str:
        return self.precision or str(self.dtype).removeprefix("torch.")

    def prepare(self, rows: int) -> None:
        """Compile what runs compiled (an int8 head) for forwards of up to ``rows`` rows: at
        start, before any reply waits for it."""
        prepare_head(self.model, rows, self.cache_dir or default_cache_dir())

    @property
    def has_vision(self) -> bool:
        return self.processor is not None and hasattr(self.model.config, "vision_config")


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def unusable_device(device: str, dtype: str) -> str | None:
    """Why the model cannot be loaded on ``device`` in ``dtype`` here (a GPU this machine lacks, a
    precision its CPU cannot run), found before loading; None when it can."""
    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(device.partition(":")[2] or 0) >= count:
            here = f"{count} CUDA device{'s' if count != 1 else ''}" if count else "no CUDA device"
            return f"--device {device}: this machine has {here}; use --device cpu or auto"
    try:
        pick_precision(dtype, pick_device(device))
    except ValueError as error:
        return str(error)
    return None


def attention_implementation(device: str) -> str:
    """flash_attention_2 when flash-attn is importable on CUDA, else PyTorch's sdpa."""
    if device.startswith("cuda"):
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            return "sdpa"
        return "flash_attention_2"
    return "sdpa"


def resolve_model(spec: str, cache_dir: Path | None) -> tuple[str | Path, str, bool]:
    """(what from_pretrained takes, a display name, whether it is instruction-tuned)."""
    if spec == EMBEDDED:  # the pretrained (base) checkpoint: GGUF general.name 'Gemma 3 270m'
        return embedded_model_dir(cache_dir), EMBEDDED_NAME, False
    from .devmodel import cached_devmodel, is_devmodel_dir, is_devmodel_name

    if is_devmodel_name(spec):  # random weights for tests and demos (devmodel.py)
        # They stand in for instruction-tuned Gemma 3 checkpoints: rendered as Gemma turns.
        return cached_devmodel(spec, cache_dir or default_cache_dir()), spec, True
    path = Path(spec).expanduser()
    if path.is_dir():
        return path, path.name, looks_instruction_tuned(path.name) or is_devmodel_dir(path)
    if path.is_absolute() or spec.startswith((".", "~")):  # a path, never a hub name
        raise FileNotFoundError(f"no model folder at {path}")
    return spec, spec, looks_instruction_tuned(spec)


def _place_for_inference(model: torch.nn.Module, device: str) -> None:
    # Taken as a Module: transformers' decorated ``to`` types its first argument as the model.
    if not device.startswith("cuda"):  # on CUDA, device_map="auto" placed it already
        model.to(device)
    model.eval()


def load_model(
    spec: str = EMBEDDED,
    *,
    cache_dir: Path | None = None,
    device: str = "auto",
    dtype: str = "auto",
) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    source, name, instruction_tuned = resolve_model(spec, cache_dir)
    device = pick_device(device)
    precision = pick_precision(dtype, device)
    config = AutoConfig.from_pretrained(source)
    kwargs: dict[str, Any] = {
        "dtype": _load_dtype(precision),
        "attn_implementation": attention_implementation(device),
    }
    if device.startswith("cuda"):
        kwargs["device_map"] = "auto"
    processor = None
    if hasattr(config, "vision_config"):
        from transformers import AutoModelForImageTextToText, AutoProcessor

        model = AutoModelForImageTextToText.from_pretrained(source, **kwargs)
        processor = AutoProcessor.from_pretrained(source)
        tokenizer = processor.tokenizer
    else:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(source)
    _place_for_inference(model, device)
    if precision.packing is not None:
        packed = pack_model(model, precision)
        head = ", the head in int8" if isinstance(model.lm_head, Int8Head) else ""
        log.info("packed %d Linear layers (%s%s)", packed, precision.packing.value, head)
    seconds = time.perf_counter() - started
    log.info(
        "loaded %s on %s as %s (attention %s) in %.1f s",
        name,
        device,
        precision.name,
        kwargs["attn_implementation"],
        seconds,
    )
    log.info("dtype %s: %s", precision.name, precision.reason)
    return LoadedModel(
        model,
        tokenizer,
        processor,
        name,
        device,
        precision.dtype,
        instruction_tuned,
        precision.name,
        cache_dir,
    )


def _load_dtype(precision: Precision) -> torch.dtype | str:
    """What ``from_pretrained`` loads in. fp16-weights loads the checkpoint's own dtype: its
    embedding table stays as saved (mapped from the file, not copied), and ``pack_model`` turns
    the rest into its float16 kernels and float32 norms."""
    if precision.packing is Packing.FBGEMM_FP16:
        return "auto"
    return precision.dtype
