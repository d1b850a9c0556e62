"""A tiny Gemma 3 whose next token is a function of the last token alone, for engine tests that
need to know what the model will write (a reply over several lines, a turn label, a reply that
never ends).

The tiny random model (engine/local/devmodel.py) with its weights set: every attention and MLP
output projection is zero, so each position's hidden state is its own token's embedding; each
scripted token's embedding is a unit direction of its own, and an untied output head maps that
direction to the token's successor. Everything else is the real model: loader, engines, KV cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

LOGIT = 20.0  # a successor's logit; every other token's is 0


def successors(tokenizer: object, texts: Mapping[str, str]) -> dict[int, int]:
    """``{"a": "b"}`` as token ids; each text must be one token."""
    ids: dict[int, int] = {}
    for text, then in texts.items():
        ids[_one_token(tokenizer, text)] = _one_token(tokenizer, then)
    return ids


def _one_token(tokenizer: object, text: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    assert len(ids) == 1, f"{text!r} is {len(ids)} tokens"
    return int(ids[0])


def build_bigram_model(tiny_text_dir: Path, path: Path, texts: Mapping[str, str]) -> Path:
    """The tiny text model in ``tiny_text_dir`` made to follow ``texts`` (a token's text to its
    successor's), saved in ``path``."""
    from transformers import AutoTokenizer, Gemma3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_text_dir)
    chain = successors(tokenizer, texts)
    model = Gemma3ForCausalLM.from_pretrained(tiny_text_dir, dtype=torch.float32)
    model.config.tie_word_embeddings = False
    hidden = model.config.hidden_size
    assert len(chain) <= hidden, "one direction of the hidden state per scripted token"
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.zero_()  # Gemma's RMSNorm scales by 1 + weight
        embedding = model.model.embed_tokens.weight
        head = torch.zeros(embedding.shape[0], hidden)
        for n, (token, then) in enumerate(chain.items()):
            embedding[token] = 0.0
            embedding[token, n] = 1.0
            head[then, n] = LOGIT
        model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
