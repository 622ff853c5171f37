"""Loading OFA checkpoint files (written here in OFA's own format) without ``ofa`` and without pickled code."""

from __future__ import annotations

import argparse
import copy

import pytest
import torch
from conftest import NARROW, make_batches, ofa_resnets

import subnetact
from subnetact.ofa import load_checkpoint, ofa_state_dict


@pytest.fixture(scope="module")
def source():
    """An OFA network with weights different from the converted model's, and its outputs on the max subnet."""
    return ofa_resnets(seed=11, **NARROW)


def _fresh():
    return subnetact.convert(ofa_resnets(seed=12, **NARROW))


def _assert_same_weights(model, net):
    theirs = net.state_dict()
    for key, value in ofa_state_dict(model).items():
        nested = key if key in theirs else None
        if nested is None:
            for flat, deep in (
                (".bn.", ".bn.bn."),
                (".conv.weight", ".conv.conv.weight"),
                (".linear.", ".linear.linear."),
            ):
                cand = key[::-1].replace(flat[::-1], deep[::-1], 1)[::-1]
                if cand in theirs:
                    nested = cand
                    break
        assert nested is not None, key
        assert torch.equal(value, theirs[nested]), key


def test_nested_dynamic_keys(tmp_path, source):
    path = tmp_path / "ofa_supernet.pth"
    torch.save({"state_dict": source.state_dict(), "epoch": 120, "best_acc": 80.1}, path)
    model = _fresh()
    assert load_checkpoint(model, path) is model
    _assert_same_weights(model, source)


def test_flat_static_keys_and_outputs(tmp_path, source):
    net = copy.deepcopy(source)
    net.set_max_net()
    flat = net.get_active_subnet().state_dict()  # OFA's static ResNets names: blocks.3.conv1.conv.weight
    assert "blocks.3.conv1.conv.weight" in flat and "classifier.linear.weight" in flat
    path = tmp_path / "flat.pth"
    torch.save({"state_dict": flat}, path)
    model = _fresh()
    load_checkpoint(model, path)
    _assert_same_weights(model, source)
    x = make_batches(1, 2, 32, seed=0)[0][0]
    with torch.no_grad():
        torch.testing.assert_close(model(x), net.eval()(x), rtol=1e-4, atol=1e-4)


def test_ofa_accepts_our_weights(source):
    """ofa_state_dict uses names OFAResNets.load_state_dict accepts: back into OFA, same weights."""
    model = _fresh()
    net = ofa_resnets(seed=13, **NARROW)
    net.load_state_dict(ofa_state_dict(model))
    _assert_same_weights(model, net)


def test_refuses_pickled_code(tmp_path, source):
    path = tmp_path / "needs_code.pth"
    torch.save({"state_dict": source.state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
    model = _fresh()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(
        subnetact.CheckpointError,
        match="needs more than tensors and plain containers to load: it pickles argparse.Namespace",
    ):
        load_checkpoint(model, path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_mismatches_are_refused_before_any_change(tmp_path, source):
    model = _fresh()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sd = dict(source.state_dict())
    with pytest.raises(subnetact.CheckpointError, match=r"does not exist"):
        load_checkpoint(model, tmp_path / "nope.pth")
    bad = dict(sd)
    bad["blocks.0.conv1.conv.conv.weight"] = torch.zeros(3, 3, 1, 1)
    with pytest.raises(subnetact.CheckpointError, match=r"'blocks.0.conv1.conv.conv.weight' has shape \(3, 3, 1, 1\)"):
        load_checkpoint(model, {"state_dict": bad})
    extra = dict(sd, **{"blocks.99.conv1.conv.conv.weight": torch.zeros(1)})
    with pytest.raises(subnetact.CheckpointError, match=r"1 unexpected keys \['blocks.99"):
        load_checkpoint(model, extra)
    partial = {k: v for k, v in sd.items() if not k.startswith("classifier")}
    with pytest.raises(subnetact.CheckpointError, match=r"2 missing keys \['classifier.linear.bias'"):
        load_checkpoint(model, partial)
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises(subnetact.CheckpointError, match="not a readable torch file"):
        load_checkpoint(model, tmp_path / "junk.pth")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    load_checkpoint(model, partial, strict=False)  # missing keys allowed: keep their values
    assert torch.equal(model.classifier.linear.weight, before["classifier.linear.weight"])
    with pytest.raises(TypeError, match="not a converted once-for-all network"):
        load_checkpoint(torch.nn.Linear(2, 2), sd)


def test_save_load_round_trip(tmp_path, source):
    model = _fresh()
    load_checkpoint(model, {"state_dict": source.state_dict()})
    batches = make_batches(2, 4, 32, seed=1)
    served = [model.space.min(), model.space.sample(0), model.space.max()]
    subnetact.calibrate(model, batches, served)
    model.actuate(served[1])
    path = tmp_path / "served.safetensors"
    subnetact.save(model, path)
    loaded = subnetact.load(path, lambda: ofa_resnets(seed=14, **NARROW))
    assert loaded.registered_subnets == tuple(served) and loaded.active == served[1]
    x = make_batches(1, 2, 32, seed=2)[0][0]
    model.eval(), loaded.eval()
    with torch.no_grad():
        for cfg in served:
            assert torch.equal(model(x, subnet=cfg), loaded(x, subnet=cfg))


class _SystemCall:
    def __reduce__(self):
        import os

        return (os.system, ("true",))


def test_refused_os_system_payload_is_named_not_called_damaged(tmp_path, source):
    # torch's message for a blocked module ("unsupported GLOBAL posix.system whose module posix is blocked") no longer
    # matched the pattern of older releases, so such a file was reported as "damaged?".
    path = tmp_path / "payload.pth"
    torch.save({"state_dict": source.state_dict(), "hook": _SystemCall()}, path)
    model = _fresh()
    with pytest.raises(subnetact.CheckpointError, match=r"it pickles (posix|nt|os)\.system") as info:
        load_checkpoint(model, path)
    assert "damaged" not in str(info.value)
