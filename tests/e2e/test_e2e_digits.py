"""The shipped digits supernet: it loads, its record is true, and it meets issue 6's targets on the test split."""

from __future__ import annotations

import warnings
from importlib import resources

import numpy as np
import pytest
import torch

import subnetact
from subnetact import digits


@pytest.fixture(scope="module")
def shipped():
    model, record = digits.load_supernet()
    images, labels = digits.test_split()
    return model, record, digits.to_input(images), torch.as_tensor(labels)


def _accuracy(model, cfg, x, y):
    with torch.no_grad():
        return 100.0 * float((model(x, subnet=cfg).argmax(1) == y).float().mean())


def test_files_are_small_and_the_pareto_set_is_registered(shipped):
    model, record, x, y = shipped
    size = resources.files("subnetact.data").joinpath(digits.WEIGHTS_FILE).stat().st_size
    assert size < 2.5e6
    served = [subnetact.SubnetConfig.from_dict(r["config"]) for r in record["pareto"]]
    assert list(model.registered_subnets) == served and not model.training
    assert len(x) == len(y) == record["data"]["test"] == 360


def test_targets_largest_97_smallest_90_at_least_6_pareto_subnets(shipped):
    model, record, x, y = shipped
    rows = record["pareto"]
    assert len(rows) >= 6
    flops = [r["flops"] for r in rows]
    val = [r["accuracy"] for r in rows]
    assert flops == sorted(flops) and val == sorted(val) and len(set(val)) == len(val)  # a Pareto front
    accs = [_accuracy(model, subnetact.SubnetConfig.from_dict(r["config"]), x, y) for r in rows]
    assert accs == pytest.approx([r["test_accuracy"] for r in rows])  # the record tells the truth
    assert accs[-1] >= 97.0 and accs[0] >= 90.0, accs


def test_flops_in_the_record_match_the_flops_model(shipped):
    model, record, x, _ = shipped
    flops = subnetact.search.FlopsModel(model, x[:1])
    for r in record["pareto"]:
        assert flops(subnetact.SubnetConfig.from_dict(r["config"])) == r["flops"]


def test_shared_statistics_baseline_is_what_the_record_says(shipped):
    # Without per-subnet statistics every subnet uses the supernet's (prefix-sliced) running statistics.
    model, record, x, y = shipped
    plain = digits.build(record)
    plain = subnetact.convert(plain, digits.CONVERT_CONFIG)
    plain.load_state_dict(model.state_dict())
    plain.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", subnetact.UncalibratedSubnetWarning)
        for r in record["pareto"]:
            cfg = subnetact.SubnetConfig.from_dict(r["config"])
            assert _accuracy(plain, cfg, x, y) == pytest.approx(r["test_accuracy_shared_stats"])


def test_subnets_span_at_least_3x_latency_at_batch_16(shipped):
    # Issue 6: the supernet's subnets must span >= 3x in latency at batch 16 on this CPU, so that scheduling matters.
    model, _, x, _ = shipped
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", subnetact.UncalibratedSubnetWarning)  # latency does not need statistics
        prof = subnetact.profile(model, [model.space.min(), model.space.max()], [16], example_input=x[:16], repeats=15)
    assert prof.latency(1, 16) >= 3.0 * prof.latency(0, 16)


def test_test_split_is_sklearns():
    datasets = pytest.importorskip("sklearn.datasets")
    model_selection = pytest.importorskip("sklearn.model_selection")
    data = datasets.load_digits()
    _, rest_x, _, rest_y = model_selection.train_test_split(
        data.images.astype(np.uint8), data.target, test_size=0.4, stratify=data.target, random_state=0
    )
    _, test_x, _, test_y = model_selection.train_test_split(
        rest_x, rest_y, test_size=0.5, stratify=rest_y, random_state=0
    )
    images, labels = digits.test_split()
    assert np.array_equal(images, test_x) and np.array_equal(labels, test_y)


def test_to_input_validates_shape():
    assert digits.to_input(np.zeros((3, 64))).shape == (3, 1, 8, 8)
    with pytest.raises(ValueError, match=r"images must have shape \(N, 8, 8\) or \(N, 64\), got \(3, 7\)"):
        digits.to_input(np.zeros((3, 7)))
