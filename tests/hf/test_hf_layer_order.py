"""Keep orders (``ConvertConfig(depth_rule=(...))``) against plain models built from the kept layers, and
``subnetact.train.order_layers`` against a brute-force greedy search on plain models."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from hf_models import NO_DROPOUT, bert, inputs

import subnetact
from subnetact.errors import ConfigError
from subnetact.layer_select import kept_layers
from subnetact.train import order_layers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import tiny_basic  # noqa: E402


def encoder(seed: int = 0):
    torch.manual_seed(seed)
    # Larger weights than BERT's 0.02 initialisation, so that every layer changes the embeddings noticeably and the
    # candidates' scores are far apart.
    return bert(head=False, initializer_range=0.3, **NO_DROPOUT)


def with_layers(model, keep):
    """A plain copy of ``model`` (unconverted BERT) that runs only the layers ``keep``, in order."""
    plain = copy.deepcopy(model)
    plain.encoder.layer = torch.nn.ModuleList([plain.encoder.layer[i] for i in keep])
    return plain


def pooled_cosine(student, teacher, mask) -> float:
    """Hand-written mean pooling over real tokens, then the mean per-sentence cosine."""
    m = mask.double().unsqueeze(-1)
    s = (student.double() * m).sum(1) / m.sum(1)
    t = (teacher.double() * m).sum(1) / m.sum(1)
    return float(((s * t).sum(-1) / (s.norm(dim=-1) * t.norm(dim=-1))).mean())


def test_kept_layers_of_a_keep_order():
    assert kept_layers(4, 2, (3, 0, 2, 1)) == [0, 3]
    assert kept_layers(4, 3, (3, 0, 2, 1)) == [0, 2, 3]
    assert kept_layers(4, 4, (3, 0, 2, 1)) == [0, 1, 2, 3]
    for bad in [(0, 1, 2), (0, 1, 2, 2), (0, 1, 2, 4)]:
        with pytest.raises(ConfigError, match="keep order"):
            kept_layers(4, 2, bad)
    assert subnetact.ConvertConfig(depth_rule=[2, 0, 1]).depth_rule == (2, 0, 1)
    for bad in [(0, 0), (-1, 0), (True, 0), ("a",)]:
        with pytest.raises(ConfigError, match="depth_rule"):
            subnetact.ConvertConfig(depth_rule=bad)


def test_a_keep_order_runs_the_kept_layers_and_survives_save_and_load(tmp_path):
    original = encoder()
    model = subnetact.convert(copy.deepcopy(original), subnetact.ConvertConfig(depth_rule=(3, 0, 2, 1)))
    x = inputs("bert", batch=3, seq=10, seed=7)
    mask = x["attention_mask"].bool()
    with torch.no_grad():
        for depth, keep in [(2, [0, 3]), (3, [0, 2, 3])]:
            cfg = model.space.make(depth=depth, width=1.0)
            expected = with_layers(original, keep)(**x).last_hidden_state
            torch.testing.assert_close(model(**x, subnet=cfg).last_hidden_state[mask], expected[mask])
        subnetact.save(model, tmp_path / "m.safetensors")
        loaded = subnetact.load(tmp_path / "m.safetensors", encoder())
        cfg = model.space.make(depth=2, width=1.0)
        torch.testing.assert_close(
            loaded(**x, subnet=cfg).last_hidden_state[mask], model(**x, subnet=cfg).last_hidden_state[mask]
        )
    with pytest.raises(ConfigError, match="4 blocks"):
        subnetact.convert(encoder(), subnetact.ConvertConfig(depth_rule=(0, 1, 2)))


def test_order_layers_is_the_greedy_drop_order_on_the_metric():
    original = encoder(seed=3)
    batches = [inputs("bert", batch=4, seq=10, seed=50 + i) for i in range(2)]
    with torch.no_grad():
        reference = [original(**b).last_hidden_state for b in batches]

    def cosine(keep) -> float:  # the metric of a plain model with these layers, weighted by sentences
        plain = with_layers(original, keep)
        with torch.no_grad():
            values = [
                pooled_cosine(plain(**b).last_hidden_state, r, b["attention_mask"]) for b, r in zip(batches, reference)
            ]
        return sum(v * b["input_ids"].shape[0] for v, b in zip(values, batches)) / sum(
            b["input_ids"].shape[0] for b in batches
        )

    kept, dropped, expected_scores = list(range(4)), [], {}
    while len(kept) > 1:  # brute force over plain models: drop the layer whose removal keeps the most
        candidates = sorted((cosine([i for i in kept if i != j]), j) for j in kept)
        assert candidates[-1][0] - candidates[-2][0] > 1e-3  # a clear winner: no tie for rounding to decide
        value, layer = candidates[-1]
        kept.remove(layer)
        dropped.append(layer)
        expected_scores[len(kept)] = value
    expected = tuple(kept + dropped[::-1])

    model = subnetact.convert(copy.deepcopy(original))
    result = order_layers(model, batches, metric="cosine", teacher=original)
    assert result.order == expected, (result, expected_scores)
    assert result.scores.keys() == expected_scores.keys()
    for d, value in expected_scores.items():
        assert result.scores[d] == pytest.approx(value, abs=1e-5)
    assert model._subnetact.convert_config.depth_rule == expected
    x = batches[0]
    mask = x["attention_mask"].bool()
    with torch.no_grad():
        for depth in (1, 2, 3):
            keep = sorted(expected[:depth])
            got = model(**x, subnet=model.space.make(depth=depth, width=1.0)).last_hidden_state
            torch.testing.assert_close(got[mask], with_layers(original, keep)(**x).last_hidden_state[mask])


def test_order_layers_refuses_what_it_cannot_order_and_changes_nothing():
    original = encoder()
    model = subnetact.convert(copy.deepcopy(original))
    batches = [inputs("bert", batch=2, seq=8, seed=9)]
    rule = model._subnetact.convert_config.depth_rule
    with pytest.raises(ConfigError, match="teacher"):
        order_layers(model, batches, metric="cosine")
    with pytest.raises(ConfigError, match="metric="):
        order_layers(model, batches, metric="bleu", teacher=original)
    with pytest.raises(ConfigError, match="batches is empty"):
        order_layers(model, [], metric="cosine", teacher=original)
    assert model._subnetact.convert_config.depth_rule == rule
    cnn = subnetact.convert(tiny_basic())  # four stages: no single order fits them
    with pytest.raises(ConfigError, match="elastic stage"):
        order_layers(cnn, [torch.randn(2, 3, 32, 32)], metric="kl", teacher=tiny_basic())
    assert {op.rule for op in cnn._subnetact.ops if hasattr(op, "rule")} == {"prefix"}
