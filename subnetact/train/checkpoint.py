"""Checkpoints of a distillation run: a directory with the supernet and the trainer's state, both safetensors.

- ``supernet.safetensors``: the model, written by :func:`subnetact.save` (loadable for serving as it is);
- ``trainer.safetensors``: the optimiser's tensors (``optim.<param index>.<name>``), the frozen teacher's weights
  (``teacher.<key>``, when the teacher is a copy of the original model), the torch random state (``rng.torch``, and
  ``rng.cuda.<i>``) and, in the metadata as JSON, the step, the subnet sampler's state (Python ``random`` state), the
  optimiser's hyper-parameters and non-tensor state, and the learning-rate scheduler's ``state_dict``.

Each file is written under a temporary name and renamed, so a crash never leaves a half-written checkpoint file.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError

MODEL_FILE = "supernet.safetensors"
TRAINER_FILE = "trainer.safetensors"
_META_KEY = "subnetact.trainer"


@dataclass
class TrainerState:
    """What a run needs besides the model's weights to continue exactly where it stopped."""

    step: int
    sampler: random.Random
    optimizer: torch.optim.Optimizer
    teacher: nn.Module | None = None
    lr_scheduler: Any = None


def save_checkpoint(directory: str | os.PathLike, model: nn.Module, trainer: TrainerState) -> Path:
    """Write ``model`` and ``trainer`` into ``directory`` (created if needed); returns the directory."""
    from safetensors.torch import save_file

    from ..io import save

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save(model, directory / MODEL_FILE)
    tensors: dict[str, torch.Tensor] = {}
    opt = trainer.optimizer.state_dict()
    opt_plain: dict[str, dict[str, Any]] = {}
    for index, entries in opt["state"].items():
        plain = {}
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{name}"] = value.detach().contiguous().cpu().clone()
            else:
                plain[name] = value
        opt_plain[str(index)] = plain
    if trainer.teacher is not None:
        for key, value in trainer.teacher.state_dict().items():
            tensors[f"teacher.{key}"] = value.detach().contiguous().cpu().clone()  # clone: tied weights stored twice
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    version, internal, gauss = trainer.sampler.getstate()
    meta = {
        "step": trainer.step,
        "sampler": [version, list(internal), gauss],
        "optimizer": {"param_groups": opt["param_groups"], "state": opt_plain},
        "lr_scheduler": None if trainer.lr_scheduler is None else trainer.lr_scheduler.state_dict(),
    }
    try:
        meta_json = json.dumps(meta)
    except TypeError as exc:
        raise CheckpointError(
            f"the trainer state cannot be written as JSON ({exc}); a learning-rate scheduler holding functions "
            "(LambdaLR) cannot be checkpointed, use one of torch's built-in schedules"
        ) from None
    tmp = directory / f".{TRAINER_FILE}.tmp"
    save_file(tensors, str(tmp), metadata={_META_KEY: meta_json})
    os.replace(tmp, directory / TRAINER_FILE)
    return directory


def load_checkpoint(directory: str | os.PathLike, model: nn.Module, trainer: TrainerState) -> None:
    """Restore ``model`` and, in place, every part of ``trainer`` from a directory written by
    :func:`save_checkpoint`.

    Raises:
        CheckpointError: the directory, a file or an entry is missing or does not match the model or optimiser.
    """
    from safetensors import SafetensorError, safe_open

    from ..io import load

    directory = Path(directory)
    path = directory / TRAINER_FILE
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})[_META_KEY])
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except FileNotFoundError:
        raise CheckpointError(f"resume={str(directory)!r}: {TRAINER_FILE} does not exist there") from None
    except (SafetensorError, OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"resume={str(directory)!r}: {TRAINER_FILE} is not readable: {exc}") from None
    load(directory / MODEL_FILE, model)
    state: dict[int, dict[str, Any]] = {int(i): dict(v) for i, v in meta["optimizer"]["state"].items()}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    try:
        trainer.optimizer.load_state_dict({"state": state, "param_groups": meta["optimizer"]["param_groups"]})
    except (ValueError, KeyError) as exc:
        raise CheckpointError(
            f"resume={str(directory)!r}: the optimiser state does not fit this optimiser: {exc}"
        ) from None
    if trainer.teacher is not None:
        teacher_sd = {k[len("teacher.") :]: v for k, v in tensors.items() if k.startswith("teacher.")}
        if not teacher_sd:
            raise CheckpointError(f"resume={str(directory)!r}: the checkpoint holds no teacher weights")
        trainer.teacher.load_state_dict(teacher_sd)
    if trainer.lr_scheduler is not None and meta["lr_scheduler"] is not None:
        trainer.lr_scheduler.load_state_dict(meta["lr_scheduler"])
    version, internal, gauss = meta["sampler"]
    trainer.sampler.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    trainer.step = int(meta["step"])


__all__ = ["MODEL_FILE", "TRAINER_FILE", "TrainerState", "load_checkpoint", "save_checkpoint"]
