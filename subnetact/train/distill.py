"""``distill``: train a converted pretrained model as a supernet by distillation from the original, no labels needed.

Every step, the subnets a :mod:`schedule <subnetact.train.schedules>` picks (by default the sandwich rule) are trained
to reproduce the teacher's outputs on the batch; their gradients add up in the shared weights and the optimiser steps
once. The teacher is

- ``"original"`` (default): a frozen copy of the model as it was when ``distill`` was called, run at full size in
  eval mode. Every subnet, the largest included, is pulled towards the pretrained function, so the full model
  is not damaged;
- ``"inplace"``: the supernet's own largest subnet, run first each step without gradient (in-place distillation of
  slimmable networks / BigNAS). Cheaper (no copy, one teacher forward less when the schedule trains the largest
  subnet), but nothing anchors the largest subnet to the pretrained model: without labels it drifts with the
  updates the smaller subnets make to the shared weights;
- any ``nn.Module`` called with the same inputs (a larger model, the unconverted original).

Before the first step, heads/neurons (encoders, :func:`subnetact.reorder` with ``score="activation"``), FFN
neurons/KV groups (decoder LLMs, :func:`subnetact.hf.reorder_decoder` with ``score="activation"``) or channels
(other models, :func:`subnetact.reorder_channels`) are put in decreasing importance, so training starts
from the best prefixes (``reorder=False`` to skip).

Under ``torchrun`` (``torch.distributed`` initialised by the caller, any backend: gloo on CPU, nccl on GPU) the same
call is data-parallel: the parameters are broadcast from rank 0, every rank takes its contiguous share of each batch
(batches are global batches), and after the step's backward passes the gradients are averaged over the ranks before
the optimiser steps -- what ``DistributedDataParallel`` does, done once per step rather than per backward because a
step runs several subnets (forward, backward) over the same weights.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import random
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._progress import Progress
from ..config import SubnetConfig
from ..errors import ArgumentTypeError, ConfigError, UncalibratedSubnetWarning
from ..supernet import state_of
from .batches import call
from .checkpoint import TrainerState, load_checkpoint, save_checkpoint
from .losses import DistillLoss, describe, resolve_loss
from .refit import RefitResult, refit_sliced_linears
from .sandwich import StepResult
from .schedules import Fixed, Sandwich, Schedule

TEACHERS = ("original", "inplace")


@dataclass
class DistillResult:
    """What :func:`distill` did.

    Attributes:
        steps: the number of optimiser steps taken (this call; a resumed run counts from its checkpoint's step).
        history: one :class:`StepResult` per step of this call: the subnets trained and each one's loss.
        reordered: whether importance reordering ran before training.
        refit: what the least-squares refit before training did (``refit_batches``), or None.
        teacher: the teacher used (the frozen copy, the model itself for ``"inplace"``, or the module given).
    """

    steps: int
    history: list[StepResult] = field(default_factory=list)
    reordered: bool = False
    refit: RefitResult | None = None
    teacher: nn.Module | None = None

    def loss_by_subnet(self, last: int | None = None) -> dict[SubnetConfig, float]:
        """Mean loss per subnet over the steps it was trained in (the ``last`` steps only, if given)."""
        sums: dict[SubnetConfig, list[float]] = {}
        for r in self.history[-last:] if last else self.history:
            for cfg, loss in zip(r.subnets, r.losses):
                sums.setdefault(cfg, []).append(loss)
        return {cfg: sum(v) / len(v) for cfg, v in sums.items()}


def distill(
    model: nn.Module,
    batches: Iterable[Any] | Callable[[int], Iterable[Any]],
    optimizer: torch.optim.Optimizer,
    *,
    steps: int | None = None,
    epochs: int = 1,
    teacher: str | nn.Module = "original",
    loss: str | DistillLoss = "auto",
    temperature: float = 1.0,
    schedule: Schedule | None = None,
    reorder: bool = True,
    reorder_batches: int = 8,
    refit_batches: int = 0,
    lr_scheduler: Any = None,
    max_grad_norm: float | None = None,
    seed: int = 0,
    autocast_dtype: torch.dtype | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int = 0,
    resume: str | os.PathLike | None = None,
    progress: bool | None = None,
    on_step: Callable[[int, StepResult], None] | None = None,
) -> DistillResult:
    """Train ``model`` (converted) as a supernet whose subnets reproduce ``teacher``'s outputs on ``batches``.

    Args:
        model: a converted model (``subnetact.convert``).
        batches: model inputs, no labels: tensors (``model(x)``), tuples (``model(*x)``) or dicts (``model(**x)``,
            e.g. ``{"input_ids": (N, T), "attention_mask": (N, T)}``). A re-iterable (a list, a DataLoader) or a
            function ``epoch -> iterable`` (called once more for epoch 0 to peek at the first batch).
        optimizer: over the model's parameters.
        steps: optimiser steps in all (default: ``epochs`` x ``len(batches)``); epochs are repeated as needed.
        epochs: passes over ``batches`` when ``steps`` is not given.
        teacher: ``"original"``, ``"inplace"`` or a module (see the module docstring).
        loss: ``"auto"``, ``"logits"``, ``"next_token"``, ``"embedding"``, ``"hidden"`` or a callable
            ``(student_outputs, teacher_outputs, batch) -> scalar`` (see :mod:`subnetact.train.losses`).
        temperature: softmax temperature of the logits losses (> 0).
        schedule: which subnets each step trains; default :class:`~subnetact.train.Sandwich` ``(num_random=2)``.
        reorder: sort heads/neurons/channels by importance first (skipped when resuming: the checkpoint is sorted).
        reorder_batches: how many of the first batches the activation score of a transformer is measured on.
        refit_batches: with N > 0, after reordering and before the first step, refit the width-sliced linear layers
            by least squares on the first N batches (:func:`~subnetact.train.refit_sliced_linears`, for the
            schedule's subnets with its weights; a :class:`~subnetact.train.Fixed` schedule only, since the refit
            fits a known served set). Give 10 or more tokens per input feature of the widest sliced layer. Skipped
            when resuming (the checkpoint holds the refit weights).
        lr_scheduler: its ``step()`` runs after every optimiser step (and is checkpointed).
        max_grad_norm: clip the averaged gradient to this norm (None: no clipping).
        seed: seeds the subnet sampler (the same on every rank).
        autocast_dtype: run the forwards under ``torch.autocast`` with this dtype (``torch.bfloat16``, or
            ``torch.float16`` on CUDA, where a ``GradScaler`` scales the loss).
        checkpoint_dir: write a checkpoint (see :mod:`subnetact.train.checkpoint`) here every ``checkpoint_every``
            steps and at the end (rank 0 writes).
        checkpoint_every: steps between checkpoints (0: only at the end).
        resume: a checkpoint directory to continue from: weights, optimiser, scheduler, teacher, sampler and torch
            random state and step are restored, and the batches already consumed are skipped, so the run continues
            as the uninterrupted one would (bit-identical on the same machine and settings).
        progress: a progress line on stderr (None: when stderr is a terminal; rank 0 only).
        on_step: called as ``on_step(step, result)`` after every step (logging); returning True stops training
            after that step (a time budget, early stopping).

    Returns:
        A :class:`DistillResult`; the model is left in eval mode. Registered (calibrated) subnets are dropped, since
        their statistics belong to the old weights: calibrate the served set afterwards.

    Raises:
        ConfigError: (a ``ValueError``) a bad argument, named; an empty ``batches``; a one-shot iterator; outputs
            that ``loss`` cannot read; a schedule naming a dimension the space lacks. Raised before the model, the
            optimiser or any state is changed.
        NotConvertedError: ``model`` is not converted.

    Example::

        >>> model = subnetact.convert(transformers.BertModel.from_pretrained(path))
        >>> opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        >>> result = subnetact.train.distill(model, batches, opt, steps=500, loss="embedding",
        ...                                  schedule=subnetact.train.Fixed(served))
    """
    state = state_of(model)
    space = state.space
    schedule = Sandwich() if schedule is None else schedule
    _check_arguments(
        batches, optimizer, steps, epochs, teacher, temperature, schedule, reorder_batches, checkpoint_every, seed,
        refit_batches,
    )  # fmt: skip
    schedule.check(space)
    first_iterable = batches(0) if callable(batches) else batches
    first = next(iter(first_iterable), _EMPTY)
    if first is _EMPTY:
        raise ConfigError("batches yielded no batch: distillation needs at least one batch of inputs")
    total = _total_steps(batches, steps, epochs)

    rank, world = _distributed()
    local_first = shard(first, rank, world)
    if isinstance(teacher, nn.Module):
        teacher_module: nn.Module | None = teacher
    elif teacher == "original":
        teacher_module = copy.deepcopy(model)
    else:
        teacher_module = None
    if teacher_module is not None:
        teacher_module.eval()
        teacher_module.requires_grad_(False)
    # Match the outputs to a loss on the first batch before anything changes (a bad loss= leaves the model as it was).
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UncalibratedSubnetWarning)
        was_training = model.training
        probe = _teacher_outputs(model, teacher_module, local_first, space.max(), train_mode=False)
        model.train(was_training)
    loss_fn = resolve_loss(loss, probe, temperature=temperature)
    del probe

    # -- from here on the model changes -----------------------------------------------------------------------------
    if world > 1:
        _broadcast_parameters(model)
    sampler = random.Random(seed)
    trainer = TrainerState(0, sampler, optimizer, teacher_module if teacher == "original" else None, lr_scheduler)
    reordered, refit = False, None
    if state.stats:
        state.stats.clear()  # statistics of the old weights (and reorder_channels refuses to move registered ones)
        state.invalidate()
    if resume is not None:
        load_checkpoint(resume, model, trainer)
    else:
        if reorder:
            _reorder(model, batches, reorder_batches, rank, world)
            reordered = True
        if refit_batches:  # every rank fits on the same global batches, so the weights stay equal
            sample = _first_batches(batches, refit_batches)
            refit = refit_sliced_linears(model, schedule.resolved(space), sample, weights=schedule.weights)

    device = next(model.parameters()).device
    scaler = None
    if autocast_dtype == torch.float16 and device.type == "cuda":
        scaler = torch.amp.GradScaler("cuda")
    bar = Progress(total - trainer.step, "distill", enabled=(progress if rank == 0 else False))
    result = DistillResult(
        0, reordered=reordered, refit=refit, teacher=teacher_module if teacher_module is not None else model
    )
    skip = trainer.step  # batches consumed before the checkpoint
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        for batch in _stream(batches, skip):
            if trainer.step >= total:
                break
            step_result = _step(
                model, teacher_module, optimizer, batch, schedule, trainer, total, loss_fn, rank, world, params,
                max_grad_norm, autocast_dtype, scaler, device,
            )  # fmt: skip
            if lr_scheduler is not None:
                lr_scheduler.step()
            trainer.step += 1
            result.steps += 1
            result.history.append(step_result)
            bar.update()
            stop = bool(on_step(trainer.step, step_result)) if on_step is not None else False
            if checkpoint_dir is not None and checkpoint_every and trainer.step % checkpoint_every == 0:
                _checkpoint(checkpoint_dir, model, trainer, rank, world)
            if stop:
                break
    finally:
        bar.close()
    if checkpoint_dir is not None and (not checkpoint_every or trainer.step % checkpoint_every):
        _checkpoint(checkpoint_dir, model, trainer, rank, world)
    model.eval()
    return result


_EMPTY = object()


def _check_arguments(
    batches, optimizer, steps, epochs, teacher, temperature, schedule, reorder_batches, checkpoint_every, seed,
    refit_batches,
) -> None:  # fmt: skip
    if not callable(batches):
        if not isinstance(batches, Iterable):
            raise ConfigError(f"batches={batches!r} must be a re-iterable of inputs or a function epoch -> iterable")
        if iter(batches) is batches:
            raise ConfigError(
                f"batches={type(batches).__name__} is a one-shot iterator; distill needs a re-iterable (a list, a "
                "DataLoader) or a function epoch -> iterable, so it can peek at the first batch and run more epochs"
            )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ArgumentTypeError(f"optimizer={optimizer!r} must be a torch.optim.Optimizer")
    for name, value, low in (("steps", steps, 1), ("epochs", epochs, 1), ("reorder_batches", reorder_batches, 1)):
        if value is None and name == "steps":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name}={value!r} must be an int >= {low}")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ConfigError(f"checkpoint_every={checkpoint_every!r} must be an int >= 0")
    if not isinstance(teacher, nn.Module) and teacher not in TEACHERS:
        raise ConfigError(f"teacher={teacher!r} must be one of {TEACHERS} or an nn.Module")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ConfigError(f"temperature={temperature!r} must be a finite number > 0")
    if not isinstance(schedule, Schedule):
        raise ConfigError(
            f"schedule={schedule!r} must be a subnetact.train schedule (Sandwich, Fixed, WidthThenDepth, "
            "ProgressiveShrinking)"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed={seed!r} must be an int")
    if isinstance(refit_batches, bool) or not isinstance(refit_batches, int) or refit_batches < 0:
        raise ConfigError(f"refit_batches={refit_batches!r} must be an int >= 0")
    if refit_batches and not isinstance(schedule, Fixed):
        raise ConfigError(
            f"refit_batches={refit_batches} needs a Fixed schedule (the served subnets the refit fits), got "
            f"schedule={type(schedule).__name__}; or call refit_sliced_linears before distill"
        )


def _total_steps(batches, steps: int | None, epochs: int) -> int:
    if steps is not None:
        return steps
    if callable(batches) or not hasattr(batches, "__len__"):
        raise ConfigError("steps=None needs batches with a len(); pass steps= for a function of the epoch")
    return epochs * len(batches)


def _stream(batches, skip: int):
    """Batches of epoch 0, 1, 2, ... forever, the first ``skip`` left out (a resumed run's consumed batches)."""
    for epoch in itertools.count():
        iterable = batches(epoch) if callable(batches) else batches
        count = 0
        for batch in iterable:
            count += 1
            if skip:
                skip -= 1
                continue
            yield batch
        if count == 0:
            return


def shard(batch: Any, rank: int, world: int) -> Any:
    """Rank ``rank``'s contiguous share of a global batch (along dimension 0 of every tensor); the batch itself
    when ``world == 1``."""
    if world == 1:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.tensor_split(world, dim=0)[rank] if batch.dim() else batch
    if isinstance(batch, Mapping):
        return {k: shard(v, rank, world) for k, v in batch.items()}  # a plain dict: the model takes it as **kwargs
    if isinstance(batch, (tuple, list)):
        return type(batch)(shard(v, rank, world) for v in batch)
    return batch


def _rows(batch: Any) -> int | None:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else None
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    return next((n for n in (_rows(v) for v in values) if n is not None), None)


def _first_batches(batches, count: int) -> list:
    """The first ``count`` batches of epoch 0 (``batches`` a re-iterable or a function epoch -> iterable)."""
    return list(itertools.islice(iter(batches(0) if callable(batches) else batches), count))


def _teacher_outputs(model, teacher_module, batch, largest, *, train_mode: bool) -> Any:
    if teacher_module is None:  # in-place: the supernet's largest subnet
        model.train(train_mode)
        return call(model, batch, largest)
    subnet = teacher_module.space.max() if hasattr(teacher_module, "_subnetact") else None
    return call(teacher_module, batch, subnet)


def _detach(outputs: Any) -> Any:
    if isinstance(outputs, torch.Tensor):
        return outputs.detach()
    if isinstance(outputs, Mapping):
        for k in list(outputs.keys()):
            if isinstance(outputs[k], torch.Tensor):
                outputs[k] = outputs[k].detach()
        return outputs
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(_detach(o) for o in outputs)
    return outputs


def _step(
    model, teacher_module, optimizer, batch, schedule, trainer, total, loss_fn, rank, world, params, max_grad_norm,
    autocast_dtype, scaler, device,
) -> StepResult:  # fmt: skip
    space = state_of(model).space
    local = shard(batch, rank, world)
    # Each rank's loss is a mean over its rows; weighting it by its share of the global batch makes the average over
    # ranks the global batch's mean (exact for equal shares, and for unequal ones where the loss is a per-row mean).
    weight = 1.0
    if world > 1:
        n_global, n_local = _rows(batch), _rows(local)
        if n_global and n_local is not None:
            weight = n_local * world / n_global
    subnets = schedule.subnets(space, trainer.step, total, trainer.sampler)
    loss_weights = schedule.loss_weights(subnets)
    largest = space.max()
    inplace = teacher_module is None
    autocast = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else _nullcontext()
    optimizer.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UncalibratedSubnetWarning)
        with torch.no_grad(), autocast:
            target = _detach(_teacher_outputs(model, teacher_module, local, largest, train_mode=True))
        model.train()
        trained, losses = [], []
        for cfg, loss_weight in zip(subnets, loss_weights):
            if inplace and cfg == largest:
                continue  # the teacher itself: its loss would be zero
            with autocast:
                value = loss_fn(call(model, local, cfg), target, local)
            if not isinstance(value, torch.Tensor) or value.numel() != 1:
                raise ConfigError(f"loss returned {describe(value)}; it must return a scalar tensor")
            scaled = value * (weight * loss_weight)
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
            trained.append(cfg)
            losses.append(float(value.detach()))
    if world > 1:
        _average_gradients(params, world)
    if scaler is not None:
        scaler.unscale_(optimizer)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return StepResult(tuple(trained), tuple(losses))


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _distributed() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _broadcast_parameters(model: nn.Module) -> None:
    import torch.distributed as dist

    with torch.no_grad():
        for t in itertools.chain(model.parameters(), model.buffers()):
            dist.broadcast(t, src=0)


def _average_gradients(params: list[nn.Parameter], world: int) -> None:
    """All-reduce the gradients, flattened into one buffer per dtype (a parameter no subnet used gets zeros)."""
    import torch.distributed as dist

    by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for p in group:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n


def _checkpoint(directory, model, trainer, rank, world) -> None:
    if rank == 0:
        save_checkpoint(directory, model, trainer)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def _reorder(model: nn.Module, batches, count: int, rank: int, world: int) -> None:
    from ..hf.decoder_reorder import reorder_decoder
    from ..hf.decoders import decoder_family_of
    from ..hf.families import family_of
    from ..hf.reorder import reorder as hf_reorder
    from ..importance import reorder_channels

    encoder, decoder = family_of(model) is not None, decoder_family_of(model) is not None
    if encoder or decoder:
        sample = _first_batches(batches, count)
        if decoder:  # FFN neurons and KV groups (Minitron-style activation importance)
            reorder_decoder(model, sample, score="activation")
        else:  # heads and FFN neurons
            hf_reorder(model, sample, score="activation")
    else:
        reorder_channels(model)


__all__ = ["DistillResult", "call", "distill", "shard"]
