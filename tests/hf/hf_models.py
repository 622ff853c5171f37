"""Tiny Hugging Face models (random weights, no downloads) and an independent dense reference for parity tests.

The reference is built the way issue 5 states parity: a dense HF model constructed from the *smaller* config
(``num_hidden_layers=D``, fewer heads, smaller ``intermediate_size``) into which the kept layers' prefix-sliced
weights are copied. It does not use ``subnetact.export``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

HIDDEN, HEADS, LAYERS, FFN = 48, 4, 4, 64
ATTN_IMPLS = ("eager", "sdpa")
# Dropout off: a train-mode forward (distillation, the refit) is then deterministic and its losses recomputable.
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def text_config(cls, attn: str, **kw):
    base = dict(
        vocab_size=64,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=40,
        attn_implementation=attn,
        pad_token_id=1,
    )
    base.update(kw)
    return cls(**base)


def bert(attn: str = "sdpa", head: bool = True, **kw) -> nn.Module:
    cfg = text_config(transformers.BertConfig, attn, **kw)
    model = transformers.BertForSequenceClassification(cfg) if head else transformers.BertModel(cfg)
    return model.eval()


def roberta(attn: str = "sdpa", head: bool = True, **kw) -> nn.Module:
    cfg = text_config(transformers.RobertaConfig, attn, **kw)
    model = transformers.RobertaForSequenceClassification(cfg) if head else transformers.RobertaModel(cfg)
    return model.eval()


def vit(attn: str = "sdpa", head: bool = True, **kw) -> nn.Module:
    base = dict(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        image_size=16,
        patch_size=4,
        num_channels=3,
        num_labels=3,
        attn_implementation=attn,
    )
    base.update(kw)
    cfg = transformers.ViTConfig(**base)
    model = transformers.ViTForImageClassification(cfg) if head else transformers.ViTModel(cfg)
    return model.eval()


FACTORIES = {"bert": bert, "roberta": roberta, "vit": vit}


def make(name: str, attn: str = "sdpa", head: bool = True, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return FACTORIES[name](attn, head)


def inputs(name: str, batch: int = 2, seq: int = 12, mask: str = "padded", seed: int = 1) -> dict:
    """Model inputs. ``mask``: "none" (no attention_mask), "ones" (all ones) or "padded" (ragged lengths, padding
    tokens in the padded positions)."""
    g = torch.Generator().manual_seed(seed)
    if name == "vit":
        return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}
    ids = torch.randint(2, 64, (batch, seq), generator=g)
    out = {"input_ids": ids}
    if mask == "ones":
        out["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
    elif mask == "padded":
        lengths = torch.randint(max(1, seq // 3), seq + 1, (batch,), generator=g)
        lengths[0] = seq
        m = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        out["input_ids"] = torch.where(m.bool(), ids, torch.ones_like(ids))  # pad_token_id=1
        out["attention_mask"] = m
    return out


def main_output(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def compare(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None, atol: float = 1e-4) -> None:
    """``a`` == ``b`` within ``atol``; for per-token outputs only where ``mask`` marks real tokens (HF leaves padded
    positions' hidden states unconstrained)."""
    assert a.shape == b.shape, (a.shape, b.shape)
    if mask is not None and a.dim() == 3:
        keep = mask.bool()
        a, b = a[keep], b[keep]
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


# -- the independent reference -------------------------------------------------------------------------------------
PATHS = {
    "bert": ("bert.encoder.layer", "attention.self", ("query", "key", "value"), "attention.output.dense"),
    "roberta": ("roberta.encoder.layer", "attention.self", ("query", "key", "value"), "attention.output.dense"),
    "vit": ("vit.layers", "attention", ("q_proj", "k_proj", "v_proj"), "attention.o_proj"),
}
FFN_PATHS = {"bert": ("intermediate.dense", "output.dense"), "roberta": ("intermediate.dense", "output.dense")}
FFN_PATHS["vit"] = ("mlp.fc1", "mlp.fc2")


def _layers_path(name: str, model: nn.Module) -> str:
    path = PATHS[name][0]
    prefix = path.split(".")[0]
    return path if hasattr(model, prefix) else path.split(".", 1)[1]


def kept(num_layers: int, depth: int) -> list[int]:
    return [i * num_layers // depth for i in range(depth)]


def reference(name: str, original: nn.Module, depth: int, heads: list[int], ffn: list[int]) -> nn.Module:
    """Dense HF model of the subnet: ``heads[j]`` heads and ``ffn[j]`` neurons in its ``j``-th layer (``j`` over the
    ``depth`` kept layers of ``original``), weights prefix-sliced from ``original`` (an unconverted model)."""
    layers_path, attn_path, qkv, out_path = PATHS[name]
    fc1_path, fc2_path = FFN_PATHS[name]
    src_cfg = original.config
    head_size = src_cfg.hidden_size // src_cfg.num_attention_heads
    cfg = copy.deepcopy(src_cfg)
    cfg.num_hidden_layers = depth
    uniform = len(set(heads)) == 1 and len(set(ffn)) == 1
    if uniform:
        cfg.intermediate_size = ffn[0]
        if name == "vit":  # ViT reads the head size from its config, so the smaller config says it all
            cfg.num_attention_heads, cfg.head_dim = heads[0], head_size
    kwargs = {}
    if isinstance(original, (transformers.BertModel, transformers.RobertaModel)):
        kwargs["add_pooling_layer"] = original.pooler is not None
    if isinstance(original, transformers.ViTModel):
        kwargs["add_pooling_layer"] = original.pooler is not None
    dense = type(original)(cfg, **kwargs).eval()
    layers = dense.get_submodule(_layers_path(name, dense))
    hidden = src_cfg.hidden_size
    for layer, h, i in zip(layers, heads, ffn):
        attn = layer.get_submodule(attn_path)
        if attn.num_attention_heads != h:
            # BERT/RoBERTa derive the head size as hidden // heads, so a config cannot say "h heads of the original
            # size"; shrink the attention as HF's prune_heads did (transformers 4): fewer heads, same head size.
            for proj in qkv:
                setattr(attn, proj, nn.Linear(hidden, h * head_size))
            parent, _, leaf = out_path.rpartition(".")
            setattr(layer.get_submodule(parent), leaf, nn.Linear(h * head_size, hidden))
            attn.num_attention_heads = h
            if hasattr(attn, "all_head_size"):
                attn.all_head_size = h * head_size
        if layer.get_submodule(fc1_path).out_features != i:
            for path, shape in ((fc1_path, (hidden, i)), (fc2_path, (i, hidden))):
                parent, _, leaf = path.rpartition(".")
                setattr(layer.get_submodule(parent), leaf, nn.Linear(*shape))
    # Copy the kept layers' weights, each tensor prefix-sliced to the dense shape.
    src = original.state_dict()
    src_layers = _layers_path(name, original)
    keep = kept(src_cfg.num_hidden_layers, depth)
    state = {}
    for key, value in dense.state_dict().items():
        src_key = key
        if key.startswith(src_layers + "."):
            j, rest = key[len(src_layers) + 1 :].split(".", 1)
            src_key = f"{src_layers}.{keep[int(j)]}.{rest}"
        state[key] = src[src_key][tuple(slice(0, n) for n in value.shape)].clone()
    dense.load_state_dict(state, strict=True)
    return dense


def heads_for(w: float) -> int:
    import math

    return max(1, math.ceil(w * HEADS - 1e-9))


def ffn_for(w: float) -> int:
    import math

    return max(1, math.ceil(w * FFN - 1e-9))
