"""What ``--model`` and ``--device`` name, checked before an engine loads: for the local engines a
folder must hold a model, a hub name must be in the hub's cache or the hub must answer, and the
device must be here; for llama.cpp's server the model must be a GGUF file. Each engine kind
names its checks (``runtime/engines.py``).

Left to transformers, a folder without a model ends in a traceback, and a hub name that is not
cached on a machine without a network in five retries over 28 s and an ``OSError`` inside a
100-line log. Each is one line here, and ``wschat-server`` exits 2 as for any bad option.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..settings import Settings

# What a folder needs for transformers to load it: its config, and weights in one of these
CONFIG = "config.json"
WEIGHTS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.bin.index.json")
# One look-up at the hub: a machine that cannot reach it is told so in seconds, not retried
HUB_TIMEOUT_S = 5.0


def folder_problem(folder: Path) -> str | None:
    """Why ``folder`` holds no model transformers can load; None when it seems to."""
    config = folder / CONFIG
    if not config.is_file():
        return f"no model in {folder} (no {CONFIG}; a model folder holds {CONFIG} and weights)"
    try:
        kind = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as error:
        return f"{config} is not a model's config ({type(error).__name__})"
    if not kind:
        return f"{config} names no model_type: not a transformers model's config"
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHTS):
        return f"no weights in {folder} (no .safetensors or pytorch_model .bin file)"
    return None


def hub_problem(name: str) -> str | None:
    """Why the hub model ``name`` cannot be loaded here: not in the cache while the hub is off
    or out of reach, or not on the hub; None when it is cached or the hub has it."""
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, CONFIG), str):
        return None
    where = f"not in the hub's cache ({constants.HF_HUB_CACHE})"
    advice = "download it where the hub answers (hf download NAME) or give a model folder"
    if constants.HF_HUB_OFFLINE:
        return f"{where}, and HF_HUB_OFFLINE is set: {advice}"
    answer = _hub_answer(constants.ENDPOINT, name)
    if answer is None:
        return None
    return f"{where}, and {answer}: {advice}"


def _hub_answer(endpoint: str, name: str) -> str | None:
    """What the hub said of ``name`` when it cannot be had from there; None when it can."""
    import httpx

    try:
        status = httpx.head(f"{endpoint}/api/models/{name}", timeout=HUB_TIMEOUT_S).status_code
    except httpx.HTTPError as error:
        reason = str(error) or type(error).__name__
        return f"{endpoint} cannot be reached ({reason})"
    if status in (401, 404):  # the hub answers 401 for a name it does not have, to strangers
        return f"{endpoint} has no model of that name (HTTP {status}; a private one needs a token)"
    return None


def device_problem(settings: Settings) -> str | None:
    """Why the local engines cannot run on ``--device`` and ``--dtype`` here, said before the
    model loads (it used to fail after it); None when they can."""
    from ..engine.local.loader import unusable_device

    return unusable_device(settings.device, settings.dtype)


def model_problem(settings: Settings) -> str | None:
    """Why the local engines cannot load ``--model`` (a folder with no model, a hub name neither
    cached nor to be had from the hub), said before they try; None when they may."""
    if settings.model == "embedded":
        return None
    from ..engine.local.devmodel import is_devmodel_name

    path = Path(settings.model).expanduser()
    if path.is_dir():
        problem = folder_problem(path)
    else:
        problem = None if is_devmodel_name(settings.model) else hub_problem(settings.model)
    return None if problem is None else f"--model {settings.model}: {problem}"


def gguf_problem(settings: Settings) -> str | None:
    """Why llama.cpp's server cannot read ``--model`` (not a GGUF file), said before it starts;
    None when it may."""
    if settings.model == "embedded":
        return None
    from .supervisor import LlamaCppError, checked_gguf

    try:
        checked_gguf(settings.model)
    except LlamaCppError as error:
        return str(error)
    return None
