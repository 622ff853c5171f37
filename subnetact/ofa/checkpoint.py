"""Load once-for-all checkpoints into a converted OFA network, without ``ofa`` and without running pickled code.

OFA's files are ``torch.save({"state_dict": sd, ...})`` (``ofa/model_zoo.py`` reads ``["state_dict"]``). Their keys
come in two spellings, and ``OFAResNets.load_state_dict`` / ``OFAMobileNetV3.load_state_dict`` accept both:

- nested dynamic names: ``blocks.3.conv1.conv.conv.weight``, ``blocks.3.conv1.bn.bn.running_mean``,
  ``classifier.linear.linear.weight``;
- flat static names (``get_active_subnet()`` of the largest subnet): ``blocks.3.conv1.conv.weight``,
  ``blocks.3.conv1.bn.running_mean``, ``classifier.linear.weight``; MobileNetV3 also has legacy
  ``.mobile_inverted_conv.`` for ``.conv.``.

The converted model uses the flat names, with block ``blocks.{i}`` at ``model.ofa_block_paths[i]``.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping

import torch
from torch import nn

from ..errors import CheckpointError, NotConvertedError
from ..supernet import SupernetMixin

# nested dynamic spelling -> flat spelling; each occurs at the end of a key (the dynamic op's inner module)
_NESTED = ((".bn.bn.", ".bn."), (".conv.conv.weight", ".conv.weight"), (".linear.linear.", ".linear."))


def _ofa_model(model: nn.Module) -> None:
    if not isinstance(model, SupernetMixin) or not hasattr(model, "ofa_block_paths"):
        raise NotConvertedError(
            f"model of type {type(model).__name__} is not a converted once-for-all network; call "
            "subnetact.convert(ofa_net) first"
        )


def _to_ofa_key(key: str, block_paths: list[str]) -> str:
    for i, path in enumerate(block_paths):
        if key.startswith(path + "."):
            return f"blocks.{i}." + key[len(path) + 1 :]
    return key


def ofa_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The converted model's weights under OFA's flat static key names (``blocks.{i}.…``), which
    ``OFAResNets.load_state_dict`` / ``OFAMobileNetV3.load_state_dict`` accept. Tensors are the model's own (no
    copy); registered SubnetNorm statistics are not part of it (OFA has no place for them)."""
    _ofa_model(model)
    return {_to_ofa_key(k, model.ofa_block_paths): v for k, v in model.state_dict().items()}


def load_checkpoint(
    model: nn.Module, checkpoint: str | os.PathLike | Mapping[str, torch.Tensor], *, strict: bool = True
) -> nn.Module:
    """Load an OFA checkpoint (file or state dict) into a converted OFA network, in place, and return the model.

    The file is read with ``torch.load(..., weights_only=True)``: a file that needs more than tensors and plain
    containers (pickled classes, functions) is refused, never executed. ``{"state_dict": sd, ...}`` and a bare
    state dict are both accepted, with nested or flat key names (see the module docstring). Registered SubnetNorm
    statistics are kept; recalibrate (``subnetact.calibrate``) after loading new weights.

    Args:
        model: the result of ``subnetact.convert(ofa_net)`` for a network of the checkpoint's shape.
        checkpoint: a path, or an already-loaded state dict.
        strict: if True, every weight of the model must be in the checkpoint and nothing else. If False, missing
            keys keep their values; unexpected keys are still an error, since they mean a different network.

    Raises:
        CheckpointError: the file is missing, unreadable, needs code to unpickle, or does not match the model
            (keys, shapes); the model is unchanged then.
    """
    _ofa_model(model)
    where = "the state dict"
    if isinstance(checkpoint, (str, os.PathLike)):
        where = repr(os.fspath(checkpoint))
        try:
            obj = torch.load(checkpoint, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {where} does not exist") from None
        except pickle.UnpicklingError as exc:
            # torch reports both a refused class and a damaged file as UnpicklingError; only the first names one.
            # The wording changed across torch releases: "Unsupported global: GLOBAL x.y" (2.4-2.6) and "unsupported
            # GLOBAL x.y whose module x is blocked" (later): match both, else an os.system payload reads "damaged".
            needs = re.search(r"unsupported global:? (?:GLOBAL )?([\w.]+)", str(exc), re.IGNORECASE)
            if needs is None:
                raise CheckpointError(f"checkpoint {where} is not a readable torch file (damaged?)") from None
            raise CheckpointError(
                f"checkpoint {where} needs more than tensors and plain containers to load: it pickles "
                f"{needs.group(1)}, which torch.load(weights_only=True) refuses. subnetact does not execute pickled "
                "code; re-save it from a trusted environment as torch.save({'state_dict': net.state_dict()}, path)"
            ) from None
        except (RuntimeError, EOFError, OSError) as exc:
            raise CheckpointError(f"checkpoint {where} is not a readable torch file: {exc}") from None
    else:
        obj = checkpoint
    if isinstance(obj, Mapping) and "state_dict" in obj:
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{where} is not an OFA checkpoint: expected {{'state_dict': {{name: tensor}}}}")

    # Phase 1: translate and check every key; nothing changes yet.
    ours = model.state_dict()
    flat_to_ours = {_to_ofa_key(k, model.ofa_block_paths): k for k in ours}
    mapped: dict[str, torch.Tensor] = {}
    unexpected = []
    for key, tensor in obj.items():
        flat = key.replace(".mobile_inverted_conv.", ".conv.")
        if flat not in flat_to_ours:
            for nested, plain in _NESTED:
                candidate = flat[::-1].replace(nested[::-1], plain[::-1], 1)[::-1]  # the last occurrence
                if candidate in flat_to_ours:
                    flat = candidate
                    break
        target = flat_to_ours.get(flat)
        if target is None:
            unexpected.append(key)
            continue
        if target in mapped:
            raise CheckpointError(f"{where} holds {target!r} twice (in nested and flat spelling)")
        if tuple(tensor.shape) != tuple(ours[target].shape):
            raise CheckpointError(
                f"{where}: {key!r} has shape {tuple(tensor.shape)}, the model's {target!r} has "
                f"{tuple(ours[target].shape)}; was the checkpoint saved from a network with other channel lists?"
            )
        mapped[target] = tensor
    missing = sorted(set(ours) - set(mapped))
    if unexpected or (strict and missing):
        raise CheckpointError(
            f"{where} does not match the model: {len(unexpected)} unexpected keys {unexpected[:5]}, "
            f"{len(missing)} missing keys {missing[:5]}"
        )
    # Phase 2: commit (load_state_dict also recompiles the plans, which hold views and derived kernels).
    model.load_state_dict(mapped, strict=strict)
    return model
