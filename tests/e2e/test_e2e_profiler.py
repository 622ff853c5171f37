"""subnetact.profile: a valid scheduling Profile measured on a tiny model, and precise errors."""

from __future__ import annotations

import math

import pytest
import torch
from e2e_models import tiny_digits

import subnetact
from scheduling import Profile, SlackFit

pytestmark = pytest.mark.filterwarnings("ignore::subnetact.UncalibratedSubnetWarning")


def test_profile_is_a_valid_scheduling_profile(tmp_path):
    model = tiny_digits()
    space = model.space
    subnets = [space.min(), space.make(depth=[2, 1, 1], width=0.5), space.max()]
    model.train()  # profile must measure in eval mode and give the mode back
    prof = subnetact.profile(
        model,
        subnets,
        [4, 1, 2],
        example_input=torch.randn(1, 1, 8, 8),
        accuracies=[90.0, 93.5, 97.0],
        repeats=5,
        keep_samples=True,
        name="tiny",
    )
    assert model.training and model.active == space.max()
    assert isinstance(prof, Profile)
    assert prof.ids == (0, 1, 2) and prof.batch_sizes == (1, 2, 4) and prof.name == "tiny"
    for s, cfg, acc in zip(prof.subnets, subnets, [90.0, 93.5, 97.0]):
        assert s.accuracy == acc and subnetact.SubnetConfig.from_dict(s.config) == cfg
        for stats in s.latency.values():
            assert len(stats.samples_s) == 5
            assert stats.mean_s == pytest.approx(sum(stats.samples_s) / 5)
            assert stats.p99_s == max(stats.samples_s) >= stats.mean_s > 0  # nearest rank of 5 samples is the max
    assert prof.metadata["repeats"] == 5 and prof.metadata["device"].startswith("cpu")
    prof.save(tmp_path / "p.json")
    again = Profile.load(tmp_path / "p.json", check="ignore")
    assert again.latency(2, 4) == prof.latency(2, 4)
    SlackFit(again).decide(1.0, 3, now=0.0)  # usable by a policy


def test_profile_mapping_ids_and_callable_input():
    model = tiny_digits()
    seen = []

    def make(b):
        seen.append(b)
        return (torch.randn(b, 1, 8, 8),)

    prof = subnetact.profile(
        model,
        {"small": model.space.min(), "big": model.space.max()},
        [3],
        example_input=make,
        accuracies={"small": 1.0, "big": 2.0},
        warmup=0,
        repeats=2,
    )
    assert prof.ids == ("small", "big") and seen == [3, 3]
    assert prof.subnet("big").accuracy == 2.0


def test_profile_slower_for_bigger_subnet_on_a_wide_model():
    # Enough work that the largest subnet is measurably slower than the smallest (16x the MACs at width 0.25).
    model = tiny_digits(widths=(32, 64, 64), blocks=(3, 3, 1))
    prof = subnetact.profile(
        model, [model.space.min(), model.space.max()], [16], example_input=torch.randn(2, 1, 8, 8), repeats=5
    )
    assert prof.latency(1, 16) > 1.5 * prof.latency(0, 16)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_sizes": []}, ValueError, r"batch_sizes=\[\] must be a non-empty"),
        ({"batch_sizes": [1, 0]}, ValueError, r"every batch size must be an int >= 1, got 0"),
        ({"batch_sizes": [2, 2]}, ValueError, r"batch_sizes=\[2, 2\] has duplicates"),
        ({"accuracies": [1.0]}, ValueError, r"accuracies has 1 values for 2 subnets"),
        ({"accuracies": [1.0, math.nan]}, ValueError, r"accuracies\[1\]=nan must be a finite number"),
        ({"accuracies": {0: 1.0}}, ValueError, r"accuracies has no entry for subnet id\(s\) \[1\]"),
        ({"repeats": 0}, ValueError, r"repeats=0 must be an int >= 1"),
        ({"warmup": -1}, ValueError, r"warmup=-1 must be an int >= 0"),
        ({"device": "meta"}, ValueError, r"device='meta' but the model is on 'cpu'; call model.to\(device\) first"),
        ({"device": "nonsense"}, ValueError, r"device='nonsense' is not a torch device"),
        ({"example_input": torch.tensor(1.0)}, ValueError, r"needs a leading batch dimension"),
        ({"example_input": "x"}, ValueError, r"example_input=str must be a tensor"),
        ({"subnets": []}, ValueError, r"subnets is empty"),
        ({"subnets": [{"depth": [9, 9, 9]}]}, ValueError, r"config has dimensions"),
    ],
)
def test_profile_errors(kwargs, error, match):
    model = tiny_digits()
    args = {
        "subnets": [model.space.min(), model.space.max()],
        "batch_sizes": [1],
        "example_input": torch.randn(1, 1, 8, 8),
        "repeats": 1,
        "warmup": 0,
    }
    args.update(kwargs)
    subnets, batch_sizes = args.pop("subnets"), args.pop("batch_sizes")
    with pytest.raises(error, match=match):
        subnetact.profile(model, subnets, batch_sizes, **args)


def test_profile_refuses_unconverted_model():
    with pytest.raises(TypeError, match="is not a converted supernet"):
        subnetact.profile(torch.nn.Linear(2, 2), [], [1], example_input=torch.randn(1, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profile_on_cuda_synchronises():
    model = tiny_digits().cuda()
    prof = subnetact.profile(model, [model.space.max()], [8], example_input=torch.randn(1, 1, 8, 8), repeats=3)
    assert prof.metadata["device"] == torch.cuda.get_device_name(0)
    assert prof.latency(0, 8) > 0
