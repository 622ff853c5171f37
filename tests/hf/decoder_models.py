"""Tiny random decoder LLMs of every built-in family (issue 24); no downloads.

Every config has 4 layers (Gemma2: alternating sliding/global), grouped-query attention where the family has it
(4 query heads sharing 2 KV heads), 8-wide heads and an FFN of 48 neurons.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 32, 4, 4, 2, 8, 48
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt2", "opt")


def _gqa(cls, attn: str, **kw):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=64,
        attn_implementation=attn,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    base.update(kw)
    return cls(**base)


def config(name: str, attn: str = "eager"):
    """The tiny config of family ``name`` with attention implementation ``attn``."""
    t = transformers
    if name == "llama":
        return _gqa(t.LlamaConfig, attn)
    if name == "mistral":
        return _gqa(t.MistralConfig, attn, sliding_window=None)
    if name == "qwen2":
        return _gqa(t.Qwen2Config, attn)
    if name == "qwen3":
        return _gqa(t.Qwen3Config, attn)
    if name == "gemma":
        return _gqa(t.GemmaConfig, attn)
    if name == "gemma2":
        return _gqa(t.Gemma2Config, attn, sliding_window=4, query_pre_attn_scalar=HEAD_DIM)
    if name == "phi3":
        cfg = _gqa(t.Phi3Config, attn)
        return cfg
    if name == "gpt2":
        return t.GPT2Config(
            vocab_size=VOCAB,
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=HEADS,
            n_inner=FFN,
            n_positions=64,
            attn_implementation=attn,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    if name == "opt":
        return t.OPTConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            word_embed_proj_dim=HIDDEN,
            ffn_dim=FFN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            max_position_embeddings=64,
            attn_implementation=attn,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    raise KeyError(name)


def make(name: str, attn: str = "eager", seed: int = 0) -> nn.Module:
    """A tiny causal LM of family ``name`` with random weights, in eval mode."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config(name, attn))
    with torch.no_grad():  # some families initialise norms to exactly 1 / 0: perturb so every weight matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


def left_padded(batch: int = 3, seq: int = 7, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``batch`` prompts of ragged lengths, left-padded with token 0."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
    lengths = torch.tensor([seq] + [max(2, seq - 2 * i) for i in range(1, batch)])
    mask = (torch.arange(seq)[None, :] >= (seq - lengths)[:, None]).long()
    return torch.where(mask.bool(), ids, torch.zeros_like(ids)), mask
