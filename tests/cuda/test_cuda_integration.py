"""WeightSlice layers and CUDA graphs with the optional kernels: CPU behaviour always, GPU behaviour when present.

On CPU the plans must never route a layer through the custom ops (the CPU forward is benchmarked and a
Python-registered op costs microseconds per call). The GPU tests compare the kernel path against PyTorch's own path
(forced with SUBNETACT_DISABLE_EXTENSION=1) and CUDA-graph replay against eager execution.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_MODELS, image_batch

import subnetact
import subnetact_cuda
from subnetact.cuda_graphs import CapturedSupernet, GraphCaptureError, capture
from subnetact.weight_slice import WeightSliceConv2d, WeightSliceLinear

_HAS_GPU = torch.cuda.is_available()
requires_gpu = pytest.mark.skipif(not _HAS_GPU, reason="needs a CUDA GPU")
requires_kernels = pytest.mark.skipif(
    not (_HAS_GPU and subnetact_cuda.available()), reason="needs a GPU and the built subnetact_cuda._C"
)


def _converted(name="bottleneck"):
    return subnetact.convert(TINY_MODELS[name]())


def _kernels(model):
    plan = model._subnetact.current()
    return [
        plan.entries[op._op_index][-1]
        for op in model._subnetact.ops
        if isinstance(op, (WeightSliceConv2d, WeightSliceLinear)) and plan.entries[op._op_index] is not None
    ]


def test_cpu_plans_never_use_the_kernels(monkeypatch):
    # Even when the extension reports itself available, CPU layers keep PyTorch's kernels.
    monkeypatch.setattr(subnetact_cuda, "available", lambda: True)
    model = _converted()
    model._subnetact.invalidate()
    kernels = _kernels(model)
    assert kernels and all(k is None for k in kernels)
    with torch.no_grad():
        assert model(image_batch()).shape == (2, 10)


def test_captured_supernet_without_graphs_runs_eagerly():
    model = _converted()
    graphed = CapturedSupernet(model, {})
    x = image_batch()
    small = model.space.min()
    with torch.no_grad(), pytest.warns(subnetact.UncalibratedSubnetWarning):
        torch.testing.assert_close(graphed(x, subnet=small), model(x, subnet=small))
    with torch.no_grad():
        torch.testing.assert_close(graphed(x), model(x))


@pytest.mark.parametrize(
    ("mutate", "kwargs", "match"),
    [
        (None, {"subnets": []}, r"subnets is empty"),
        (None, {"batch_sizes": []}, r"batch_sizes=\[\] must be a non-empty list of ints >= 1"),
        (None, {"batch_sizes": [1, 0]}, r"batch_sizes=\[1, 0\] must be"),
        ("train", {}, r"training mode; call model.eval\(\) first"),
        (None, {}, r"the model is on cpu; CUDA graphs need it on a CUDA device"),
    ],
)
def test_capture_errors(mutate, kwargs, match):
    model = _converted()
    if mutate == "train":
        model.train()
    args = {"subnets": [model.space.max()], "batch_sizes": [1], "sample": image_batch(1), **kwargs}
    with pytest.raises(GraphCaptureError, match=match):
        capture(model, **args)


def test_capture_rejects_unconverted_model_and_invalid_subnet():
    with pytest.raises(GraphCaptureError, match=r"ResNet is not a converted model; call subnetact.convert"):
        capture(TINY_MODELS["basic"](), [], [1], sample=image_batch(1))
    model = _converted()
    with pytest.raises(subnetact.InvalidSubnetError):
        capture(model, [{"depth": [99, 99, 99, 99]}], [1], sample=image_batch(1))


# -- GPU only ------------------------------------------------------------------------------------------------------
@requires_kernels
@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_kernel_path_matches_pytorch_path(monkeypatch, name):
    model = _converted(name).cuda()
    x = image_batch(4).cuda()
    configs = [model.space.max(), model.space.min()]
    assert any(k is not None for k in _kernels(model))
    with torch.no_grad(), pytest.warns(subnetact.UncalibratedSubnetWarning):
        fast = [model(x, subnet=c) for c in configs]
    monkeypatch.setenv(subnetact_cuda.DISABLE_ENV, "1")
    model._subnetact.invalidate()
    assert all(k is None for k in _kernels(model))
    with torch.no_grad():
        slow = [model(x, subnet=c) for c in configs]
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@requires_kernels
def test_kernel_path_trains():
    model = _converted().cuda().train()
    model(image_batch(4).cuda()).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@requires_gpu
def test_graph_replay_matches_eager():
    model = _converted().cuda()
    subnets = [model.space.max(), model.space.min()]
    with pytest.warns(subnetact.UncalibratedSubnetWarning):
        graphed = capture(model, subnets, [1, 3], sample=image_batch(1).cuda())
    assert graphed.has_graph(subnets[1], 3) and not graphed.has_graph(subnets[1], 2)
    with torch.no_grad():
        for cfg in subnets:
            for b in (1, 3, 2):  # 2 was not captured: eager fallback
                x = image_batch(b, seed=b).cuda()
                torch.testing.assert_close(graphed(x, subnet=cfg), model(x, subnet=cfg))
        model.actuate(subnets[1])
        x = image_batch(3, seed=7).cuda()
        torch.testing.assert_close(graphed(x), model(x))
