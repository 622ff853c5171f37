"""The training path on a CUDA device gives what it gives on the CPU: importance reordering (encoders, decoders,
CNN channel groups), the layer order, the least-squares refit and ``distill`` itself. Skipped without a GPU (CI has
none); run on one with ``pytest tests/hf/test_hf_train_cuda.py``.

The CPU run of the same call on a copy of the same model is the reference: orders must be equal, weights and
losses equal within float tolerance (the GPU's reductions run in another order).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from decoder_models import left_padded
from decoder_models import make as make_decoder
from hf_models import NO_DROPOUT, bert, inputs

import subnetact
from subnetact.importance import reorder_channels
from subnetact.train import Fixed, distill, order_layers, refit_sliced_linears

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the tiny CNNs
from tiny_models import tiny_basic  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def on(batch, device: str):
    return {k: v.to(device) for k, v in batch.items()}


def twins(make):
    """A converted model on the CPU and an identical copy on the GPU; full-precision matmuls on the GPU."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cpu = make()
    return cpu, copy.deepcopy(cpu).cuda()


def encoder():
    torch.manual_seed(0)
    return subnetact.convert(bert(head=False, **NO_DROPOUT), subnetact.ConvertConfig(depth_rule="spread"))


def batches(n: int = 3) -> list[dict]:
    return [inputs("bert", batch=4, seq=10, seed=40 + i) for i in range(n)]


def assert_same_weights(cpu: torch.nn.Module, gpu: torch.nn.Module, atol: float = 1e-5) -> None:
    for (name, a), (_, b) in zip(cpu.state_dict().items(), gpu.state_dict().items()):
        torch.testing.assert_close(b.cpu(), a, atol=atol, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("score", ["activation", "l1", "taylor"])
def test_encoder_reorder_on_gpu_matches_cpu(score):
    cpu, gpu = twins(encoder)
    data = batches()
    kwargs = {} if score == "l1" else {"batches": data}
    if score == "taylor":  # no labels: any scalar of the outputs scores the units
        kwargs["loss_fn"] = lambda outputs, batch: outputs.last_hidden_state.square().mean()
    want = subnetact.reorder(cpu, score=score, **kwargs)
    if "batches" in kwargs:
        kwargs["batches"] = [on(b, "cuda") for b in data]
    got = subnetact.reorder(gpu, score=score, **kwargs)
    for a, b in zip(want.head_order + want.ffn_order, got.head_order + got.ffn_order):
        assert torch.equal(a, b.cpu())
    assert_same_weights(cpu, gpu)


def test_decoder_reorder_on_gpu_matches_cpu():
    cpu, gpu = twins(lambda: subnetact.convert(make_decoder("llama")))
    ids, mask = left_padded()
    want = subnetact.hf.reorder_decoder(cpu, [{"input_ids": ids, "attention_mask": mask}])
    got = subnetact.hf.reorder_decoder(gpu, [{"input_ids": ids.cuda(), "attention_mask": mask.cuda()}])
    for a, b in zip(want.ffn_order + want.kv_order, got.ffn_order + got.kv_order):
        assert torch.equal(a, b.cpu())
    assert_same_weights(cpu, gpu)


def test_cnn_reorder_channels_on_gpu_matches_cpu():
    cpu, gpu = twins(lambda: subnetact.convert(tiny_basic()))
    for a, b in zip(reorder_channels(cpu), reorder_channels(gpu)):
        assert torch.equal(a, b.cpu())
    assert_same_weights(cpu, gpu)


def test_layer_order_and_refit_on_gpu_match_cpu():
    cpu, gpu = twins(encoder)
    data = batches()
    teacher = copy.deepcopy(cpu)
    want_order = order_layers(cpu, data, metric="cosine", teacher=teacher).order
    gpu_data, gpu_teacher = [on(b, "cuda") for b in data], copy.deepcopy(teacher).cuda()
    assert order_layers(gpu, gpu_data, metric="cosine", teacher=gpu_teacher).order == want_order
    space = cpu.space
    subnets = [space.max(), space.make(depth=2, width=0.5)]
    want = refit_sliced_linears(cpu, subnets, data * 4, weights=[4.0, 1.0])
    got = refit_sliced_linears(gpu, subnets, [on(b, "cuda") for b in data] * 4, weights=[4.0, 1.0])
    assert want.layers.keys() == got.layers.keys() and want.rows == got.rows
    assert_same_weights(cpu, gpu, atol=1e-4)


def test_distill_on_gpu_reorders_and_trains_like_cpu():
    cpu, gpu = twins(encoder)
    data = batches(2)
    subnets = Fixed((cpu.space.max(), cpu.space.make(depth=2, width=0.5)), weights=(4.0, 1.0))
    results = []
    for model, device in ((cpu, "cpu"), (gpu, "cuda")):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        results.append(
            distill(model, [on(b, device) for b in data], opt, steps=3, schedule=subnets, reorder_batches=2, seed=0)
        )
    assert results[0].reordered and results[1].reordered
    for a, b in zip(results[0].history, results[1].history):
        assert a.subnets == b.subnets
        assert b.losses == pytest.approx(a.losses, rel=1e-3, abs=1e-6)
    assert_same_weights(cpu, gpu, atol=1e-4)


def test_distill_on_gpu_with_bf16_autocast_runs_and_learns():
    _, gpu = twins(encoder)
    data = [on(b, "cuda") for b in batches(2)]
    small = gpu.space.make(depth=2, width=0.5)
    opt = torch.optim.AdamW(gpu.parameters(), lr=1e-3)
    result = distill(gpu, data, opt, steps=30, schedule=Fixed((small,)), autocast_dtype=torch.bfloat16, seed=0)
    first, last = result.history[0].losses[0], result.history[-1].losses[0]
    assert last < 0.5 * first
