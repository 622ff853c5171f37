"""Decoder LLM supernets (issue 24): every built-in family, tiny random configs, against the original model and
``export()``; KV cache, left padding, ``generate(subnet=)``, per-step FFN changes and refused layout changes."""

from __future__ import annotations

import copy
import inspect
import random
import threading
from dataclasses import replace

import pytest
import torch
from decoder_models import FAMILIES, FFN, KV_HEADS, LAYERS, left_padded, make, transformers

import subnetact
from subnetact.errors import InvalidSubnetError, UnsupportedModelError

ATTNS = ("eager", "sdpa")
CASES = [(n, a) for n in FAMILIES for a in ATTNS if not (n == "gemma2" and a == "sdpa")]  # Gemma2: eager only
_CACHE: dict = {}
# The cache keyword: ``cache`` from transformers 5.2x on (``past_key_values`` deprecated), ``past_key_values`` before.
_CACHE_KW = (
    "cache" if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters else "past_key_values"
)


def kv(cache) -> dict:
    return {_CACHE_KW: cache}


def converted(name: str, attn: str):
    key = (name, attn)
    if key not in _CACHE:
        original = make(name, attn)
        _CACHE[key] = (original, subnetact.convert(copy.deepcopy(original)))
    return _CACHE[key]


def rel(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """max |a - b| / max |b|; per-token outputs only at real tokens where ``mask`` (B, T) is given (the outputs at
    padding positions are unconstrained)."""
    assert a.shape == b.shape, (a.shape, b.shape)
    if mask is not None:
        a, b = a[mask.bool()], b[mask.bool()]
    return ((a - b).abs().max() / b.abs().max()).item()


def subnets(model, seed: int = 0):
    rng = random.Random(seed)
    return {"min": model.space.min(), "random": model.space.sample(rng), "max": model.space.max()}


def incremental(model, ids, mask, prefill: int, **kw) -> torch.Tensor:
    """Logits of ``ids`` computed as a prefill of ``prefill`` tokens, then one token per step with the KV cache."""
    cache = transformers.DynamicCache(config=model.config)
    out = [model(input_ids=ids[:, :prefill], attention_mask=mask[:, :prefill], **kv(cache), **kw).logits]
    for t in range(prefill, ids.shape[1]):
        step = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], **kv(cache), **kw)
        out.append(step.logits)
    return torch.cat(out, dim=1)


def greedy(model, ids, mask, **kw) -> torch.Tensor:
    return model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None, **kw
    )


@pytest.mark.parametrize("name,attn", CASES)
def test_plain_convert_and_largest_subnet_is_the_original(name, attn):
    original, model = converted(name, attn)
    assert isinstance(model, type(original))
    ids, mask = left_padded()
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
        want = original(input_ids=ids, attention_mask=mask).logits
    assert rel(got, want) <= 1e-6
    assert torch.equal(got[mask.bool()], want[mask.bool()])  # convert checks this bit for bit on its own input too
    assert model.space.links == {"width": ("heads", "ffn")}
    assert ("depth" in model.space.dims) == (name != "gemma2")  # Gemma2's layers alternate sliding/global masks


@pytest.mark.parametrize("name,attn", CASES)
def test_subnets_equal_export_with_and_without_cache_and_in_generate(name, attn):
    _, model = converted(name, attn)
    ids, mask = left_padded(seq=9)
    for label, cfg in subnets(model).items():
        exported = model.export(cfg).eval()
        assert not any(isinstance(m, subnetact.operator.Operator) for m in exported.modules())
        with torch.no_grad():
            full = model(input_ids=ids, attention_mask=mask, subnet=cfg).logits
            want = exported(input_ids=ids, attention_mask=mask).logits
            assert rel(full, want, mask) <= 1e-5, label
            cached = incremental(model, ids, mask, 5, subnet=cfg)
            assert rel(cached, full, mask) <= 1e-5, label
            assert rel(cached, incremental(exported, ids, mask, 5), mask) <= 1e-5, label
            assert torch.equal(greedy(model, ids, mask, subnet=cfg), greedy(exported, ids, mask)), label


@pytest.mark.parametrize("name", ["llama", "gpt2", "phi3"])
def test_subnet_shapes_kv_cache_and_exported_config(name):
    _, model = converted(name, "sdpa")
    cfg = model.space.make(depth=2, heads=0.5, ffn=0.25)
    exported = model.export(cfg)
    kv_heads = 1 if name != "gpt2" else 2  # GPT-2 has no GQA: its 4 heads are 4 KV groups
    assert exported.config.num_hidden_layers == 2
    assert exported.config.subnetact_subnet["supernet_layers"] == [0, 2]
    assert exported.config.subnetact_subnet["num_key_value_heads"] == [kv_heads, kv_heads]
    assert exported.config.subnetact_subnet["intermediate_size"] == [FFN // 4] * 2
    ids, mask = left_padded()
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, **kv(cache), subnet=cfg)
    # The supernet's cache is indexed by supernet layer: layers 1 and 3 are skipped and hold nothing.
    assert cache.layers[0].keys.shape == (3, kv_heads, 7, 8)
    assert cache.layers[2].keys.shape == (3, kv_heads, 7, 8)
    assert all(getattr(cache.layers[i], "keys", None) is None or cache.layers[i].keys.numel() == 0 for i in (1, 3))
    if name == "llama":  # Llama reads every shape from its config: the exported config rebuilds the subnet
        rebuilt = transformers.LlamaForCausalLM(exported.config).eval()
        rebuilt.load_state_dict(exported.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(
                rebuilt(input_ids=ids, attention_mask=mask).logits,
                exported.eval()(input_ids=ids, attention_mask=mask).logits,
                rtol=0,
                atol=0,
            )


def test_gqa_keeps_whole_kv_groups_with_their_query_heads():
    _, model = converted("llama", "eager")
    attn = model.model.layers[0].self_attn
    for w, groups in ((0.25, 1), (0.5, 1), (0.75, 2), (1.0, 2)):
        cfg = model.space.make(depth=LAYERS, heads=w, ffn=1.0)
        q_heads, kv_heads, _, _ = model._subnetact.plan_for(cfg).entries[attn._op_index]
        assert (q_heads, kv_heads) == (2 * groups, groups)  # 4 query heads share 2 KV heads: 2 per group
    assert KV_HEADS == 2


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_ffn_width_changes_mid_sequence_share_the_cache_bit_identically(name):
    _, model = converted(name, "eager")
    ids, mask = left_padded(seq=6)
    widths = [1.0, 0.5, 0.25, 0.75, 0.25, 1.0, 0.5]  # per step: the prefill, then one per new token
    cfgs = [model.space.make(depth=3, heads=0.5, ffn=w) for w in widths]
    exports = {cfg: model.export(cfg).eval() for cfg in set(cfgs)}
    cache = transformers.DynamicCache(config=model.config)
    ref_cache = transformers.DynamicCache(config=next(iter(exports.values())).config)
    tokens, ref_tokens, m = ids, ids, mask
    with torch.no_grad():
        for step, cfg in enumerate(cfgs):
            x = tokens if step == 0 else tokens[:, -1:]
            got = model(input_ids=x, attention_mask=m, **kv(cache), subnet=cfg).logits[:, -1]
            want = exports[cfg](input_ids=x, attention_mask=m, **kv(ref_cache)).logits[:, -1]
            assert torch.equal(got, want), step
            nxt = got.argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
            m = torch.cat([m, torch.ones_like(nxt)], dim=1)
    assert cache.get_seq_length() == ids.shape[1] + len(widths) - 1
    del ref_tokens


@pytest.mark.parametrize("change", ["heads", "depth"])
def test_heads_or_depth_change_mid_sequence_is_refused_and_cache_unchanged(change):
    _, model = converted("qwen2", "eager")
    ids, mask = left_padded()
    first = model.space.make(depth=4, heads=1.0, ffn=0.5)
    other = model.space.make(depth=3 if change == "depth" else 4, heads=0.5 if change == "heads" else 1.0, ffn=0.5)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, **kv(cache), subnet=first)
        before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        step_mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
        with pytest.raises(InvalidSubnetError, match=r"subnet=.*only FFN widths may change"):
            model(input_ids=ids[:, :1], attention_mask=step_mask, **kv(cache), subnet=other)
        assert all(
            torch.equal(layer.keys, k) and torch.equal(layer.values, v) for layer, (k, v) in zip(cache.layers, before)
        )
        # an FFN-only change extends the same cache; a fresh cache takes any subnet
        model(
            input_ids=ids[:, :1],
            attention_mask=step_mask,
            **kv(cache),
            subnet=model.space.make(depth=4, heads=1.0, ffn=0.25),
        )
        model(input_ids=ids, attention_mask=mask, **kv(transformers.DynamicCache()), subnet=other)


def test_generate_with_subnet_is_thread_safe_and_leaves_the_default():
    _, model = converted("llama", "sdpa")
    ids, mask = left_padded()
    cfgs = [model.space.min(), model.space.make(depth=3, width=0.5), model.space.max()]
    with torch.no_grad():
        want = [greedy(model, ids, mask, subnet=c) for c in cfgs]
    results: dict = {}
    errors: list = []

    def worker(k: int) -> None:
        try:
            with torch.no_grad():
                for _ in range(3):
                    out = greedy(model, ids, mask, subnet=cfgs[k % 3])
                    results.setdefault(k, []).append(out)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for k, outs in results.items():
        assert all(torch.equal(o, want[k % 3]) for o in outs), k
    assert model.active == model.space.max()
    with pytest.raises(InvalidSubnetError):
        model.generate(input_ids=ids, subnet={"depth": [LAYERS + 1]}, max_new_tokens=2)


def test_actuated_model_generates_its_active_subnet():
    _, model = converted("mistral", "sdpa")
    ids, mask = left_padded()
    cfg = model.space.make(depth=2, width=0.75)
    try:
        model.actuate(cfg)
        with torch.no_grad():
            got = greedy(model, ids, mask)
    finally:
        model.actuate(model.space.max())
    with torch.no_grad():
        assert torch.equal(got, greedy(model.export(cfg).eval(), ids, mask))


class _OPTWithoutHeadCount(transformers.OPTForCausalLM):
    """An OPT whose family forgets that its attention reshapes by ``num_heads``."""


def test_a_wrong_family_is_refused_at_convert_and_rolled_back():
    name = f"{__name__}._OPTWithoutHeadCount"
    subnetact.hf.register_decoder(replace(subnetact.hf.OPT, overrides=()), [name])
    torch.manual_seed(0)
    model = _OPTWithoutHeadCount(make("opt").config).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    classes = {n: type(m) for n, m in model.named_modules()}
    with pytest.raises(UnsupportedModelError):
        subnetact.convert(model)
    assert type(model) is _OPTWithoutHeadCount
    assert {n: type(m) for n, m in model.named_modules()} == classes
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_register_decoder_validates_its_arguments():
    with pytest.raises(subnetact.errors.ConfigError, match="DecoderFamily"):
        subnetact.hf.register_decoder(subnetact.hf.BERT, ["a.B"])
    with pytest.raises(subnetact.errors.ConfigError, match="module.QualName"):
        subnetact.hf.register_decoder(subnetact.hf.LLAMA, "transformers.models.llama.modeling_llama.LlamaModel")
    with pytest.raises(subnetact.errors.ConfigError, match="kind"):
        replace(subnetact.hf.LLAMA, overrides=(("num_heads", "heads"),))


def test_base_model_without_lm_head_converts():
    torch.manual_seed(0)
    base = transformers.LlamaModel(make("llama").config).eval()
    model = subnetact.convert(copy.deepcopy(base))
    ids, mask = left_padded()
    cfg = model.space.make(depth=3, width=0.5)
    with torch.no_grad():
        assert torch.equal(
            model(input_ids=ids, attention_mask=mask).last_hidden_state,
            base(input_ids=ids, attention_mask=mask).last_hidden_state,
        )
        got = model(input_ids=ids, attention_mask=mask, subnet=cfg).last_hidden_state
        want = model.export(cfg).eval()(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    assert rel(got, want, keep) <= 1e-5
    assert LAYERS == 4


@pytest.mark.parametrize("name", ["llama", "qwen2", "opt"])
@pytest.mark.parametrize("score", ["activation", "magnitude"])
def test_reorder_decoder_preserves_the_full_model_and_sorts_by_score(name, score):
    original = make(name, "eager", seed=3)
    model = subnetact.convert(copy.deepcopy(original))
    ids, mask = left_padded()
    sample = [torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(5))]
    result = subnetact.hf.reorder_decoder(model, sample if score == "activation" else None, score=score)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
        want = original(input_ids=ids, attention_mask=mask).logits
    assert rel(got, want, mask) <= 1e-5  # function-preserving at full width
    for layer in range(LAYERS):
        for order, importance in (
            (result.ffn_order[layer], result.ffn_importance[layer]),
            (result.kv_order[layer], result.kv_importance[layer]),
        ):
            assert sorted(order.tolist()) == list(range(len(order)))
            assert torch.all(importance[order][:-1] >= importance[order][1:])
    # the kept prefix is the highest-scored: neuron 0 of layer 0 now holds the former best neuron's down column
    down = model.get_submodule("model.decoder.layers.0.fc2" if name == "opt" else "model.layers.0.mlp.down_proj")
    down0 = original.get_submodule("model.decoder.layers.0.fc2" if name == "opt" else "model.layers.0.mlp.down_proj")
    assert torch.equal(down.weight[:, 0], down0.weight[:, result.ffn_order[0][0]])


def test_reorder_decoder_refuses_fused_families_and_bad_arguments():
    with pytest.raises(UnsupportedModelError, match="fuses"):
        subnetact.hf.reorder_decoder(make("phi3"), score="magnitude")
    with pytest.raises(subnetact.errors.ConfigError, match="score"):
        subnetact.hf.reorder_decoder(make("llama"), score="taylor")
    with pytest.raises(subnetact.errors.ConfigError, match="batches"):
        subnetact.hf.reorder_decoder(make("llama"))


def test_depth_rule_spread_keeps_the_last_layer_with_cache_and_generate():
    """``ConvertConfig(depth_rule="spread")`` on a decoder: depth 2 of 4 runs layers 0 and 3, equal to the export
    with and without the KV cache and in greedy decoding."""
    model = subnetact.convert(make("llama"), subnetact.ConvertConfig(depth_rule="spread"))
    cfg = model.space.make(depth=2, width=1.0)
    model.actuate(cfg)
    assert model.model.layers.kept_positions(cfg) == [0, 3]
    assert [id(m) for m in model.model.layers] == [id(model.model.layers[0]), id(model.model.layers[3])]
    exported = model.export(cfg).eval()
    ids, mask = left_padded(seq=9)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, subnet=cfg).logits
        assert rel(full, exported(input_ids=ids, attention_mask=mask).logits, mask) <= 1e-5
        assert rel(incremental(model, ids, mask, 5, subnet=cfg), full, mask) <= 1e-5
        assert torch.equal(greedy(model, ids, mask, subnet=cfg), greedy(exported, ids, mask))
