"""Tiny random-weight Gemma 3 models for tests, demos and machines without real weights.

Both are built with the real transformers classes (``Gemma3ForCausalLM``,
``Gemma3ForConditionalGeneration`` with a SigLIP vision tower, ``Gemma3Processor``) and the
Gemma tokenizer the embedded model ships, so everything around the weights (loader, tokenizer,
processor, placeholders, masks, KV cache) runs for real; only the replies are nonsense.

    python -m wschat.server.engine.local.devmodel --text DIR    # a text-only model
    python -m wschat.server.engine.local.devmodel --vision DIR  # images: 64x64, 16 tokens
    wschat-server --model tiny-random-vision  # built once into the cache directory, then served

The output embedding rows of ``<eos>`` and ``<end_of_turn>`` are zeroed so that a greedy reply
never ends by chance: tests get replies that run until ``max_new_tokens`` or a cancel.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

TINY_TEXT = "tiny-random"
TINY_VISION = "tiny-random-vision"

EOS_ID = 1
END_OF_TURN_ID = 106
IMAGE_SIZE = 64
PATCH_SIZE = 16
TOKENS_PER_IMAGE = 16  # (64 / 16)^2 patches, pooled 1:1
INIT_STD = 0.02  # Gemma3Config's default initializer_range
IMAGE_TOKEN = "<image_soft_token>"
BOI_TOKEN = "<start_of_image>"
EOI_TOKEN = "<end_of_image>"
_MARKER = "wschat-devmodel.json"
BUILD_VERSION = 2  # bump when what the builders make changes: cached folders are rebuilt


def _text_config(vocab_size: int) -> Any:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=4096,
        bos_token_id=2,
        eos_token_id=EOS_ID,
        pad_token_id=0,
        tie_word_embeddings=True,
    )


def _embedded_tokenizer(cache_dir: Path | None) -> Any:
    from transformers import AutoTokenizer

    from .embedded_model import embedded_model_dir

    return AutoTokenizer.from_pretrained(embedded_model_dir(cache_dir))


def _never_ends_by_chance(model: Any) -> None:
    """Zero the (tied) embedding rows of the end tokens: their logit is 0, below the max."""
    with torch.no_grad():
        model.get_input_embeddings().weight[[EOS_ID, END_OF_TURN_ID]] = 0.0


def _images_make_a_difference(model: Any, std: float) -> None:
    """transformers initializes the image projection to zeros (every image would embed as 0)."""
    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, std)


def _save(model: Any, files: Any, path: Path) -> Path:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=2, eos_token_id=[EOS_ID, END_OF_TURN_ID], pad_token_id=0
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    files.save_pretrained(path)
    (path / _MARKER).write_text(json.dumps({"seed": 0, "version": BUILD_VERSION}) + "\n")
    return path


def build_tiny_text_model(
    path: str | Path, *, seed: int = 0, cache_dir: Path | None = None
) -> Path:
    """A random ``Gemma3ForCausalLM`` (2 layers, hidden 64) with the Gemma tokenizer, in ``path``.

    ``cache_dir`` is where the embedded model (the tokenizer's source) is cached.
    """
    from transformers import Gemma3ForCausalLM

    tokenizer = _embedded_tokenizer(cache_dir)
    torch.manual_seed(seed)
    # Held as a Module: transformers' decorated ``to`` types its first argument as the model.
    model: torch.nn.Module = Gemma3ForCausalLM(_text_config(len(tokenizer)))
    model.to(torch.float32).eval()
    _never_ends_by_chance(model)
    return _save(model, tokenizer, Path(path))


def vision_tokenizer(cache_dir: Path | None = None) -> Any:
    """The Gemma tokenizer plus ``<image_soft_token>`` (id 262144, as in Gemma 3 4B).

    The embedded GGUF's vocabulary lacks it (it would map to ``<unk>``); the processor's
    ``boi``/``eoi``/``image`` token names are saved with the tokenizer.
    """
    from tokenizers import AddedToken

    tokenizer = _embedded_tokenizer(cache_dir)
    tokenizer.add_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)])
    tokenizer._set_model_specific_special_tokens(
        {"boi_token": BOI_TOKEN, "eoi_token": EOI_TOKEN, "image_token": IMAGE_TOKEN}
    )
    return tokenizer


def build_tiny_vision_model(
    path: str | Path, *, seed: int = 0, cache_dir: Path | None = None
) -> Path:
    """A random ``Gemma3ForConditionalGeneration`` with a SigLIP tower and its processor."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
        SiglipVisionConfig,
    )

    tokenizer = vision_tokenizer(cache_dir)
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        vision_use_head=False,
    )
    config = Gemma3Config(
        text_config=_text_config(len(tokenizer)),
        vision_config=vision,
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=tokenizer.convert_tokens_to_ids(BOI_TOKEN),
        eoi_token_index=tokenizer.convert_tokens_to_ids(EOI_TOKEN),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        initializer_range=INIT_STD,
    )
    torch.manual_seed(seed)
    model: torch.nn.Module = Gemma3ForConditionalGeneration(config)
    model.to(torch.float32).eval()
    _never_ends_by_chance(model)
    _images_make_a_difference(model, INIT_STD)
    image_processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = Gemma3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_length=TOKENS_PER_IMAGE
    )
    return _save(model, processor, Path(path))


_BUILDERS = {TINY_TEXT: build_tiny_text_model, TINY_VISION: build_tiny_vision_model}


def is_devmodel_name(spec: str) -> bool:
    return spec in _BUILDERS


def is_devmodel_dir(path: Path) -> bool:
    """A folder these builders made (they stand in for instruction-tuned Gemma 3 checkpoints)."""
    return (path / _MARKER).is_file()


def cached_devmodel(name: str, cache_dir: Path) -> Path:
    """The folder of ``tiny-random`` / ``tiny-random-vision`` under ``cache_dir``, built once."""
    target = cache_dir / name
    built = {"name": name, "seed": 0, "version": BUILD_VERSION}
    if _read_marker(target / _MARKER) == built:
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    _BUILDERS[name](partial, cache_dir=cache_dir)
    (partial / _MARKER).write_text(json.dumps(built) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)  # atomic: a crash mid-build never leaves a half folder in place
    return target


def _read_marker(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wschat.server.engine.local.devmodel",
        description="Write a tiny random-weight Gemma 3 model folder (real classes, the embedded "
        "model's Gemma tokenizer) that wschat-server --model DIR can serve.",
    )
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument("--text", metavar="DIR", help="a text-only Gemma3ForCausalLM")
    kind.add_argument(
        "--vision",
        metavar="DIR",
        help=f"a Gemma3ForConditionalGeneration reading {IMAGE_SIZE}x{IMAGE_SIZE} images "
        f"({TOKENS_PER_IMAGE} tokens each) with its Gemma3Processor",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    args = parser.parse_args(argv)
    if args.text:
        path = build_tiny_text_model(args.text, seed=args.seed)
    else:
        path = build_tiny_vision_model(args.vision, seed=args.seed)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
