"""``save`` / ``load``: one safetensors file holding the weights, the registered statistics and, in its metadata, the
space and the registered subnets as JSON."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .config import SubnetConfig
from .errors import CheckpointError
from .space import Space
from .supernet import SupernetMixin, state_of

FORMAT = "subnetact"
FORMAT_VERSION = 1
_MODEL_PREFIX = "model."
_STATS_PREFIX = "stats."


def save(model: nn.Module, path: str | os.PathLike) -> None:
    """Write ``model`` (weights, buffers, registered subnets and their statistics, space, active subnet) to ``path``.

    The file is written to a temporary name and renamed, so a crash never leaves a half-written file at ``path``.
    Tensors that share storage (tied weights) are stored once.
    """
    from safetensors.torch import save_file

    state = state_of(model)
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for key, tensor in model.state_dict().items():
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)
        if tensor.numel() and ident in seen:
            aliases[_MODEL_PREFIX + key] = seen[ident]
            continue
        seen[ident] = _MODEL_PREFIX + key
        tensors[_MODEL_PREFIX + key] = tensor.detach().contiguous().cpu()
    subnets = list(state.stats)
    for i, cfg in enumerate(subnets):
        tensors[f"{_STATS_PREFIX}{i}"] = state.stats[cfg].detach().contiguous().cpu()
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model_class": f"{type(model)._subnetact_base.__module__}.{type(model)._subnetact_base.__qualname__}",
        "convert_config": state.convert_config.to_dict(),
        "space": state.space.to_dict(),
        "subnets": [cfg.to_dict() for cfg in subnets],
        "active": state.default_config.to_dict(),
        "aliases": aliases,
        "sha256": _digest(tensors),
    }
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={FORMAT: json.dumps(header)})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: str | os.PathLike, model_or_factory: nn.Module | Callable[[], nn.Module]) -> nn.Module:
    """Load a file written by :func:`save` into a model and return the model.

    Args:
        path: the file.
        model_or_factory: the model to fill, or a zero-argument callable building it (e.g.
            ``torchvision.models.resnet50``). An unconverted model is converted with the saved convert options.

    Raises:
        CheckpointError: (a ``ValueError``) the file is missing, truncated or corrupted (checksum), was not written by
            subnetact, or does not match the model (space, keys, shapes, dtypes). Nothing is changed then.
    """
    from safetensors import SafetensorError, safe_open

    from .convert import ConvertConfig, convert

    path = Path(path)
    try:
        # One open reads the header (metadata) and every tensor; a truncated file fails here.
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
        header = json.loads(metadata[FORMAT])
    except FileNotFoundError:
        raise CheckpointError(f"{str(path)!r} does not exist") from None
    except (SafetensorError, OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{str(path)!r} is not a readable subnetact checkpoint (truncated or corrupted?): {exc}"
        ) from None
    if header.get("format") != FORMAT or header.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{str(path)!r} has format {header.get('format')!r} version {header.get('format_version')!r}; "
            f"this subnetact reads {FORMAT!r} version {FORMAT_VERSION}"
        )
    if _digest(tensors) != header.get("sha256"):
        raise CheckpointError(f"{str(path)!r} is corrupted: the tensor data does not match its sha256 checksum")

    model = model_or_factory if isinstance(model_or_factory, nn.Module) else model_or_factory()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model_or_factory returned {type(model).__name__}, not an nn.Module")
    converted_here = not isinstance(model, SupernetMixin)
    if converted_here:
        # Converting a fresh model is the caller's intent; on a mismatch below it is handed back unconverted.
        options = {k: tuple(v) if isinstance(v, list) else v for k, v in header["convert_config"].items()}
        convert(model, ConvertConfig(**options))
    try:
        _load_validated(model, tensors, header, path)
    except CheckpointError:
        if converted_here:
            from .convert import unconvert

            unconvert(model)
        raise
    return model


def _load_validated(model: nn.Module, tensors: dict, header: dict, path: Path) -> None:
    state = model._subnetact
    where = repr(str(path))
    space = Space.from_dict(header["space"])
    if space != state.space:
        raise CheckpointError(
            f"{where} was saved from a model with a different space:\n{space}\nthe model has:\n{state.space}"
        )
    for alias, target in header["aliases"].items():
        tensors[alias] = tensors[target]
    expected = model.state_dict()
    model_tensors = {k[len(_MODEL_PREFIX) :]: v for k, v in tensors.items() if k.startswith(_MODEL_PREFIX)}
    missing = sorted(set(expected) - set(model_tensors))
    unexpected = sorted(set(model_tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{where} does not match the model: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}"
        )
    for key, ref in expected.items():
        got = model_tensors[key]
        if got.shape != ref.shape or got.dtype != ref.dtype:
            raise CheckpointError(
                f"{where}: {key!r} has shape {tuple(got.shape)} and dtype {got.dtype}; "
                f"the model has {tuple(ref.shape)} and {ref.dtype}"
            )
    stats = {}
    for i, cfg_dict in enumerate(header["subnets"]):
        cfg = state.space.validate(SubnetConfig.from_dict(cfg_dict))
        buffer = tensors.get(f"{_STATS_PREFIX}{i}")
        numel = 2 * sum(k for _, k in state.stats_layout(cfg))
        if buffer is None or buffer.numel() != numel:
            raise CheckpointError(f"{where}: statistics of subnet {cfg.id} are missing or have the wrong size")
        stats[cfg] = buffer
    active = state.space.validate(SubnetConfig.from_dict(header["active"]))

    # Everything checked: commit.
    with torch.no_grad():
        for key, ref in expected.items():
            ref.copy_(model_tensors[key])
    device = next((t.device for t in expected.values()), torch.device("cpu"))
    dtype = next((m.running_mean.dtype for m in state.ops if getattr(m, "running_mean", None) is not None), None)
    state.stats = {cfg: t.to(device=device, dtype=dtype or t.dtype) for cfg, t in stats.items()}
    state.invalidate(default=active)


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(tensors):
        t = tensors[key].contiguous()
        h.update(key.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
