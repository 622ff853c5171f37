"""The elastic decode loop (issue 24, deliverable 5) on tiny random decoders: continuous batching with a per-iteration
FFN width equals, token for token, a per-sequence generation that runs the same widths step by step."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from decoder_models import LAYERS, VOCAB, make, transformers

import subnetact
from scheduling import DecodeScheduler, InvalidRequestError, LatencyStats, Profile, Subnet
from subnetact.errors import ConfigError, NotConvertedError, UnsupportedModelError
from subnetact.hf import ElasticDecodeEngine

WIDTHS = (0.25, 0.5, 1.0)
_MODELS: dict = {}


def converted(name: str):
    if name not in _MODELS:
        _MODELS[name] = subnetact.convert(copy.deepcopy(make(name, "eager")))
    return _MODELS[name]


def profiles(model, heads: float = 1.0) -> tuple[Profile, Profile]:
    """Step latency w * (2 + 3 B) ms, prefill w * (1 + tokens / 8) ms: with tpot 8 ms only narrower widths keep up
    as the batch grows, so the width changes with every join and leave."""
    depth = {"depth": LAYERS} if "depth" in model.space.dims else {}  # Gemma2 has no elastic depth
    cfg = {w: model.space.make(**depth, heads=heads, ffn=w).to_dict() for w in WIDTHS}
    steps = Profile(
        [
            Subnet(f"ffn{w}", w, {b: LatencyStats(w * (2 + 3 * b) * 1e-3) for b in (1, 2, 3, 4, 8)}, cfg[w])
            for w in WIDTHS
        ]
    )
    prefill = Profile(
        [
            Subnet(f"ffn{w}", w, {t: LatencyStats(w * (1 + t / 8) * 1e-3) for t in (8, 16, 32, 64)}, cfg[w])
            for w in WIDTHS
        ]
    )
    return steps, prefill


def reference(model, engine: ElasticDecodeEngine, prompt: list[int], widths: list) -> list[int]:
    """One sequence alone, no padding: the prefill, then one token per step, each with the width the engine chose."""
    cache = transformers.DynamicCache(config=model.config)
    ids = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        for k, sid in enumerate(widths):
            x = ids if k == 0 else torch.tensor([[out[-1]]])
            mask = torch.ones(1, len(prompt) + k, dtype=torch.long)
            kw = {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}
            logits = model(input_ids=x, attention_mask=mask, subnet=engine.subnets[sid], **kw).logits
            out.append(int(logits[0, -1].argmax()))
    return out


TRACE = [  # (arrival ms, prompt, max_new_tokens): joins and leaves while others run
    (0.0, [5, 9, 3], 7),
    (1.0, [11, 4, 20, 7, 33, 8], 9),
    (4.0, [2, 60], 5),
    (5.0, [17, 18, 19, 21], 8),
    (30.0, [40, 41, 42, 43, 44, 45, 46], 6),
    (30.0, [3], 4),
]


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_engine_equals_per_sequence_reference_with_the_widths_it_chose(name):
    model = converted(name)
    steps, prefill = profiles(model)
    sched = DecodeScheduler(steps, prefill, tpot_s=0.008, ttft_s=0.02, max_batch=4)
    engine = ElasticDecodeEngine(model, sched, clock="profile")
    ids = [engine.submit(p, max_new_tokens=n, arrival_s=t * 1e-3) for t, p, n in TRACE]
    engine.run()
    assert sched.done and ids == list(range(len(TRACE)))
    changed = 0
    for (_, prompt, n), i in zip(TRACE, ids, strict=True):
        rec = sched.records[i]
        assert rec.finished and len(rec.subnet_ids) == len(engine.tokens(i)) == n  # completed once, whole
        assert engine.tokens(i) == reference(model, engine, prompt, rec.subnet_ids), i
        changed += len(set(rec.subnet_ids)) > 1
    assert changed >= 2  # widths changed mid-sequence
    assert sched.summary().sequences == len(TRACE) and sched.summary().decode_steps < sum(n for *_, n in TRACE)


def test_eos_ends_a_sequence_and_its_row_leaves_the_batch():
    model = converted("llama")
    steps, prefill = profiles(model)
    full = DecodeScheduler(steps, prefill, tpot_s=0.008, ttft_s=0.02)
    engine = ElasticDecodeEngine(model, full, clock="profile")
    a = engine.submit([5, 9, 3], max_new_tokens=8)
    engine.submit([7, 7, 1, 2], max_new_tokens=8)
    engine.run()
    eos = engine.tokens(a)[3]
    stop = engine.tokens(a).index(eos) + 1
    sched = DecodeScheduler(steps, prefill, tpot_s=0.008, ttft_s=0.02)
    engine2 = ElasticDecodeEngine(model, sched, clock="profile")
    a2 = engine2.submit([5, 9, 3], max_new_tokens=8, eos_token_id=eos)
    b2 = engine2.submit([7, 7, 1, 2], max_new_tokens=8)
    engine2.run()
    assert engine2.tokens(a2) == engine.tokens(a)[:stop]
    assert sched.records[a2].finished and len(sched.records[a2].on_time) == stop
    # b (no stop token) ran on after a left: its row was re-indexed and the padding columns trimmed
    assert stop < 8 and len(engine2.tokens(b2)) == 8 and sched.records[b2].finished
    assert engine2.tokens(b2) == reference(model, engine2, [7, 7, 1, 2], sched.records[b2].subnet_ids)


def test_bad_input_is_refused_and_nothing_is_queued():
    model = converted("llama")
    steps, prefill = profiles(model)
    sched = DecodeScheduler(steps, prefill, tpot_s=0.008, ttft_s=0.02)
    engine = ElasticDecodeEngine(model, sched, clock="profile")
    for bad in ([], [[1, 2]], [1.5, 2.0], [VOCAB], [-1], "abc"):
        with pytest.raises(ConfigError, match=r"input_ids must be"):
            engine.submit(bad, max_new_tokens=3)
    with pytest.raises(InvalidRequestError, match=r"max_new_tokens must be an int >= 1, got 0"):
        engine.submit([1, 2], max_new_tokens=0)
    with pytest.raises(InvalidRequestError, match=r"prompt_tokens must be <= 64"):
        engine.submit(list(range(1, 60)) * 2, max_new_tokens=1)
    with pytest.raises(ConfigError, match=r"eos_token_id must be an int or None, got '2'"):
        engine.submit([1, 2], max_new_tokens=3, eos_token_id="2")
    assert not sched.records and engine.run() is None and sched.done
    with pytest.raises(NotConvertedError, match=r"must be converted"):
        ElasticDecodeEngine(make("llama", "eager"), DecodeScheduler(steps, prefill, tpot_s=0.008, ttft_s=0.02))
    engine.submit([1, 2], max_new_tokens=1)
    with pytest.raises(ConfigError, match=r"scheduler must be fresh"):
        ElasticDecodeEngine(model, sched)
    with pytest.raises(ConfigError, match=r"clock must be a callable"):
        ElasticDecodeEngine(model, DecodeScheduler(steps, prefill, tpot_s=0.008, ttft_s=0.02), clock="wall")
    mixed = {"ffn0.25": model.space.make(depth=LAYERS, heads=0.5, ffn=0.25)}
    mixed |= {f"ffn{w}": model.space.make(depth=LAYERS, heads=1.0, ffn=w) for w in (0.5, 1.0)}
    with pytest.raises(ConfigError, match=r"share one KV-cache layout"):
        ElasticDecodeEngine(model, DecodeScheduler(steps, prefill, tpot_s=0.008, ttft_s=0.02), subnets=mixed)


def test_sliding_window_caches_are_refused():
    model = converted("gemma2")
    steps, prefill = profiles(model)
    with pytest.raises(UnsupportedModelError, match=r"sliding windows"):
        ElasticDecodeEngine(model, DecodeScheduler(steps, prefill, tpot_s=0.008, ttft_s=0.02))


def test_wall_clock_run_feeds_an_adaptive_scheduler():
    model = converted("llama")
    steps, prefill = profiles(model)
    sched = DecodeScheduler(steps, prefill, tpot_s=0.05, ttft_s=0.5, max_batch=4, adaptive=True)
    engine = ElasticDecodeEngine(model, sched)  # the wall clock
    ids = [engine.submit(p, max_new_tokens=n) for _, p, n in TRACE[:3]]
    engine.run()
    decode_model, prefill_model = sched.latency_models
    # every phase reported (a sample more than 20x off the profile is counted as rejected; the machine may be busy)
    assert decode_model.observed + decode_model.rejected == sched.summary().decode_steps > 0
    assert prefill_model.observed + prefill_model.rejected == sched.summary().prefills > 0
    for (_, prompt, _), i in zip(TRACE, ids, strict=False):
        assert engine.tokens(i) == reference(model, engine, prompt, sched.records[i].subnet_ids)
