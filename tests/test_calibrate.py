"""calibrate: per-subnet statistics equal a hand-computed exact average over the calibration batches."""

from __future__ import annotations

import warnings

import pytest
import torch
from tiny_models import TINY_MODELS, image_batch
from torch import nn

import subnetact
from subnetact import InvalidSubnetError, UncalibratedSubnetWarning


def reference_statistics(dense: nn.Module, batches: list[torch.Tensor]) -> dict[str, tuple[torch.Tensor, ...]]:
    """Run the exported plain model in train mode (BatchNorm normalises with batch statistics) and average each
    norm's per-batch mean and biased variance, weighted by batch size — computed here from the captured inputs."""
    captured: dict[str, list[tuple[torch.Tensor, int]]] = {}

    def hook(name):
        def fn(module, args):
            x = args[0].double()
            captured.setdefault(name, []).append((x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False), x.shape[0]))

        return fn

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in dense.named_modules() if isinstance(m, nn.BatchNorm2d)]
    dense.train()
    with torch.no_grad():
        for x in batches:
            dense(x)
    for h in handles:
        h.remove()
    out = {}
    for name, rows in captured.items():
        total = sum(n for _, _, n in rows)
        out[name] = (sum(m * n for m, _, n in rows) / total, sum(v * n for _, v, n in rows) / total)
    return out


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_statistics_are_the_exact_batch_size_weighted_average(arch):
    model = subnetact.convert(TINY_MODELS[arch]())
    subnets = [model.space.min(), model.space.sample(5), model.space.max()]
    batches = [image_batch(3, seed=1), image_batch(5, seed=2), image_batch(2, seed=3)]  # unequal sizes
    registered = subnetact.calibrate(model, batches, subnets=subnets)
    assert registered == subnets and model.registered_subnets == tuple(subnets)

    for cfg in subnets:
        dense = model.export(cfg)
        # Reference from an independent plain model carrying the *supernet's* statistics (export before
        # registration would be equivalent): only its activations matter in train mode.
        expected = reference_statistics(model.export(cfg), batches)
        got = {n: (m.running_mean, m.running_var) for n, m in dense.named_modules() if isinstance(m, nn.BatchNorm2d)}
        assert got.keys() == expected.keys()
        for name, (mean, var) in got.items():
            torch.testing.assert_close(mean.double(), expected[name][0], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(var.double(), expected[name][1], rtol=1e-4, atol=1e-5)


def test_statistics_keep_only_the_channels_the_subnet_uses():
    model = subnetact.convert(TINY_MODELS["bottleneck"]())
    small, full = model.space.min(), model.space.max()
    subnetact.calibrate(model, [image_batch(4)], subnets=[small, full])
    stats = model._subnetact.stats
    assert stats[small].numel() < stats[full].numel()
    expected = 2 * sum(m.num_features for m in model.export(small).modules() if isinstance(m, nn.BatchNorm2d))
    assert stats[small].numel() == expected


def test_calibrated_statistics_change_outputs_and_the_default_is_the_active_subnet():
    model = subnetact.convert(TINY_MODELS["basic"]())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UncalibratedSubnetWarning)
        cfg = model.actuate(model.space.min())
    x = image_batch()
    with torch.no_grad():
        before = model(x)
        assert subnetact.calibrate(model, [image_batch(8, seed=4)]) == [cfg]
        after = model(x)
    assert not torch.allclose(before, after)


def test_calibration_accepts_labelled_batches_and_one_shot_iterators():
    model = subnetact.convert(TINY_MODELS["basic"]())
    cfg = model.space.sample(1)
    xs = [image_batch(4, seed=i) for i in range(2)]
    subnetact.calibrate(model, [(x, torch.zeros(4)) for x in xs], subnets=[cfg])
    a = model._subnetact.stats[cfg].clone()
    subnetact.calibrate(model, iter(xs), subnets=[cfg])
    assert torch.equal(model._subnetact.stats[cfg], a)


def test_bad_input_registers_nothing():
    model = subnetact.convert(TINY_MODELS["basic"]())
    good = model.space.sample(0)
    with pytest.raises(InvalidSubnetError, match=r"depth\[0\]=7 is not allowed"):
        subnetact.calibrate(model, [image_batch()], subnets=[good, good.replace(depth=(7, 1, 1, 1))])
    with pytest.raises(InvalidSubnetError, match="batches is empty"):
        subnetact.calibrate(model, [], subnets=[good])

    def explode(m, batch):
        raise RuntimeError("boom")

    with pytest.raises(
        subnetact.ConfigError, match=r"batch 0 \(a Tensor, tensor shapes \[\(2, 3, 32, 32\)\]\) .*boom"
    ):
        subnetact.calibrate(model, [image_batch()], subnets=[good], forward_fn=explode)
    with pytest.raises(subnetact.ConfigError, match=r"batch 1 .*\(2, 5, 32, 32\).*RuntimeError"):
        subnetact.calibrate(model, [image_batch(), torch.randn(2, 5, 32, 32)], subnets=[good])
    with pytest.raises(subnetact.ConfigError, match="ran no SubnetNorm"):
        subnetact.calibrate(model, [image_batch()], subnets=[good], forward_fn=lambda m, b: None)
    assert model.registered_subnets == ()
    assert model.training is False


@pytest.mark.parametrize("arch", ["googlenet", "inception_v3"])
def test_torchvision_aux_heads_are_skipped_with_a_note(arch):
    # As built by default, GoogLeNet and Inception-v3 hold auxiliary classifiers that run only in training: calibrate
    # skips their norms with a note (it raised a raw RuntimeError) and the calibrated subnets equal their exports.
    import torchvision

    from subnetact.verify import relative_difference

    torch.manual_seed(0)
    model = torchvision.models.get_model(arch, init_weights=False).eval()
    assert model.aux_logits
    subnetact.convert(model)
    size = 128 if arch == "inception_v3" else 32  # the size convert picked (Inception pools below 75 px)
    batches = [torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    served = [model.space.min(), model.space.sample(0)]
    with pytest.warns(UncalibratedSubnetWarning, match=r"never ran in eval mode \('(aux1|AuxLogits)\.") as caught:
        subnetact.calibrate(model, batches, subnets=served)
    assert len(caught) == 1
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        for cfg in served:  # float32 rounding apart (strided slices vs contiguous copies): 1e-6 of the output's scale
            assert relative_difference(model(x, subnet=cfg), subnetact.export(model, cfg).eval()(x)) < 1e-5
