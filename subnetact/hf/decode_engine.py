"""An in-process elastic decode loop: continuous batching of greedy generations on a converted decoder LLM, with the
FFN width of every iteration picked from the per-token latency target and the queue (issue 24, deliverable 5).

The decisions (admission, prefill width, decode-step width, token deadlines) are :class:`scheduling.DecodeScheduler`'s;
this module runs them on the model. The same scheduler replays a trace without a model in
:func:`scheduling.simulate_decode`.

**KV cache: one batched cache with left padding.** The running sequences share one ``DynamicCache`` whose rows are
the sequences, left-padded to a common length (the padding is masked by ``attention_mask`` and the positions are
each sequence's own). Newcomers are prefilled together as a left-padded batch in a cache of their own, which is
then padded to the running cache's length (or the running cache to theirs) and concatenated along the batch; a
sequence that ends has its row removed, and columns that have become padding in every row are trimmed. One forward
then steps every running sequence (per-sequence caches would run one forward per sequence). The subnets of an engine
must share one KV layout (the same depth and KV heads, differing in FFN widths): the width may then change at every
iteration on the same cache, as :mod:`subnetact.hf.decoders` allows.

Outputs equal, token for token, a per-sequence generation that runs the same widths step by step (tested); the
batched forward's logits differ from the per-sequence ones only by float rounding (relative 1e-5 in fp32).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from ..config import SubnetConfig
from ..errors import ConfigError, InvalidSubnetError, NotConvertedError, UnsupportedModelError
from .decoder_ops import DecoderAttention

if TYPE_CHECKING:  # `import subnetact` must not import `scheduling` (tests/test_lean_import.py)
    from scheduling import DecodeScheduler, DecodeStep, Prefill

__all__ = ["ElasticDecodeEngine"]


def _cache_kwarg(model: nn.Module) -> str:
    """``cache`` from transformers 5.2x on (``past_key_values`` deprecated), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def _pad_left(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """``t`` with zeros prepended along ``dim`` up to ``length``."""
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class ElasticDecodeEngine:
    """Continuous batching of greedy generations on a converted decoder LLM, one FFN width per iteration.

    Single-threaded: one loop calls :meth:`submit`, :meth:`step` and :meth:`run`.

    Args:
        model: A decoder LLM converted by :func:`subnetact.convert` (in eval mode; its weights are not changed).
        scheduler: A fresh :class:`scheduling.DecodeScheduler` whose profiles' subnet ids are the engine's subnets.
        subnets: Profile subnet id -> :class:`~subnetact.SubnetConfig` of ``model``. Default: each profile subnet's
            ``config`` (a :meth:`SubnetConfig.to_dict`). All must share one KV-cache layout (same depth and KV heads).
        clock: ``time.monotonic`` (default, wall-clock seconds) or any callable; ``"profile"``: a simulated clock that
            advances by the profiled mean latency of every forward the engine runs, for runs whose decisions are
            deterministic (tests, reproducible comparisons) while the outputs are the model's.
        pad_token_id: Token id placed in the padding (masked, never attended); default 0.

    Raises:
        NotConvertedError: ``model`` was not converted.
        UnsupportedModelError: the model's cache has sliding-window layers (padding would shift their windows).
        ConfigError: a subnet id of the profiles has no config, or the subnets' KV layouts differ.

    Example::

        engine = ElasticDecodeEngine(model, DecodeScheduler(steps, prefills, tpot_s=0.05, ttft_s=1.0))
        seq = engine.submit(tokenizer("The capital of France is").input_ids, max_new_tokens=16)
        engine.run()
        engine.tokens(seq), engine.scheduler.records[seq].subnet_ids  # the tokens and each token's width
    """

    def __init__(
        self,
        model: nn.Module,
        scheduler: DecodeScheduler,
        *,
        subnets: Mapping[Any, SubnetConfig] | None = None,
        clock: Callable[[], float] | Literal["profile"] = time.monotonic,
        pad_token_id: int = 0,
    ) -> None:
        import transformers  # noqa: F401 - only a converted HF model reaches here; keep `import subnetact` light

        from scheduling import DecodeScheduler  # noqa: F811 - the runtime import of the TYPE_CHECKING name

        if getattr(model, "_subnetact", None) is None:
            raise NotConvertedError(
                f"model must be converted by subnetact.convert, got a plain {type(model).__name__!r}"
            )
        if not isinstance(scheduler, DecodeScheduler):
            raise ConfigError(f"scheduler must be a scheduling.DecodeScheduler, got {type(scheduler).__name__}")
        if scheduler.records:
            raise ConfigError(f"scheduler must be fresh, it already holds {len(scheduler.records)} sequence(s)")
        if not (clock == "profile" or callable(clock)):
            raise ConfigError(f"clock must be a callable returning seconds or 'profile', got {clock!r}")
        profile = scheduler.decode_policy.profile
        if subnets is None:
            missing = [s.id for s in profile.subnets if not s.config]
            if missing:
                raise ConfigError(
                    f"profile subnets {missing!r} have no config; pass subnets={{id: SubnetConfig}} or profile them "
                    f"with config=SubnetConfig.to_dict()"
                )
            subnets = {s.id: SubnetConfig.from_dict(s.config) for s in profile.subnets}
        unknown = [i for i in profile.ids if i not in subnets]
        if unknown:
            raise ConfigError(f"subnets has no config for profile subnet ids {unknown!r}; it has {list(subnets)!r}")
        self.model, self.scheduler, self.pad_token_id = model, scheduler, int(pad_token_id)
        self.subnets = {i: subnets[i] for i in profile.ids}
        self._check_layouts()
        self._cache_kw = _cache_kwarg(model)
        probe = transformers.DynamicCache(config=model.config)
        sliding = [type(layer).__name__ for layer in probe.layers if type(layer).__name__ != "DynamicLayer"]
        if sliding:
            raise UnsupportedModelError(
                f"{type(model).__name__} keeps {sliding[0]} cache layers (sliding windows): a left-padded batched "
                f"cache would shift their windows; the elastic decode loop supports full-attention caches only"
            )
        self._new_cache = lambda: transformers.DynamicCache(config=model.config)
        self._simulated = clock == "profile"
        self._t = 0.0
        self._clock = clock if callable(clock) else None
        self._prompts: list[torch.Tensor] = []
        self._eos: list[int | None] = []
        self._tokens: list[list[int]] = []
        self._cache: Any = None  # the running batch's cache; rows follow scheduler.running
        self._mask: torch.Tensor | None = None  # (B, L) 1 at real tokens, 0 at left padding
        self._rows: list[int] = []  # sequence id of each row

    def _check_layouts(self) -> None:
        attn = next((m for m in self.model.modules() if isinstance(m, DecoderAttention)), None)
        if attn is None:
            raise UnsupportedModelError(f"{type(self.model).__name__} is not a converted decoder LLM")
        layouts = {}
        for sid, cfg in self.subnets.items():
            try:
                layouts[sid] = self.model._subnetact.plan_for(cfg).entries[attn._op_index][3]
            except (InvalidSubnetError, KeyError) as exc:
                raise ConfigError(f"subnet {sid!r}: {cfg!r} is not a subnet of this model ({exc})") from None
        first = next(iter(layouts.values()))
        other = {sid: lay for sid, lay in layouts.items() if lay != first}
        if other:
            raise ConfigError(
                f"the subnets must share one KV-cache layout (depth, KV features per layer): differ in FFN widths "
                f"only; {list(layouts)[0]!r} has {first!r} but {other!r}"
            )

    # --------------------------------------------------------------- clock
    def now(self) -> float:
        """The engine's clock, in seconds (the simulated one with ``clock="profile"``)."""
        return self._t if self._simulated else self._clock()

    def _advance(self, profile: Any, subnet_id: Any, size: int) -> None:
        if self._simulated:
            self._t += profile.latency(subnet_id, size)

    # --------------------------------------------------------------- sequences
    def submit(
        self,
        input_ids: Sequence[int] | torch.Tensor,
        *,
        max_new_tokens: int,
        eos_token_id: int | None = None,
        arrival_s: float | None = None,
    ) -> int:
        """Queue a prompt for greedy generation; returns its sequence id.

        Args:
            input_ids: The prompt's token ids, shape ``(T,)`` (a list or a 1-D integer tensor), ``T >= 1``.
            max_new_tokens: Most tokens to generate (>= 1).
            eos_token_id: Generation ends after this token (default: only ``max_new_tokens``).
            arrival_s: Arrival time on the engine's clock (default: :meth:`now`); a later time holds the sequence
                back until then (trace replay).

        Raises:
            ConfigError: ``input_ids`` is not a non-empty 1-D sequence of ids in ``[0, vocab_size)``;
                :class:`scheduling.InvalidRequestError` (a ``ValueError``) for the scheduler's arguments. Nothing is
                queued.
        """
        vocab = self.model.config.vocab_size
        try:
            prompt = torch.as_tensor(input_ids)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"input_ids must be a 1-D sequence of token ids, got {input_ids!r} ({exc})") from None
        if prompt.dim() != 1 or prompt.numel() == 0 or prompt.dtype.is_floating_point or prompt.dtype == torch.bool:
            raise ConfigError(f"input_ids must be a non-empty 1-D sequence of integer token ids, got {input_ids!r}")
        if int(prompt.min()) < 0 or int(prompt.max()) >= vocab:
            raise ConfigError(f"input_ids must be token ids in [0, {vocab}), got {input_ids!r}")
        if eos_token_id is not None and (isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int)):
            raise ConfigError(f"eos_token_id must be an int or None, got {eos_token_id!r}")
        seq = self.scheduler.submit(
            int(prompt.numel()), max_new_tokens, arrival_s=self.now() if arrival_s is None else arrival_s
        )
        self._prompts.append(prompt.to(torch.long))
        self._eos.append(eos_token_id)
        self._tokens.append([])
        return seq

    def tokens(self, seq_id: int) -> list[int]:
        """The tokens generated so far for ``seq_id`` (all of them once it has finished)."""
        return list(self._tokens[seq_id])

    # --------------------------------------------------------------- the loop
    def step(self) -> bool:
        """One iteration: admit and prefill what the scheduler admits, then one decode step of the running batch.

        Returns:
            ``False`` if there was nothing to run now (nothing running, nothing arrived).
        """
        sched = self.scheduler
        start = self.now()
        plan = sched.plan_prefill(start)
        if plan is not None:
            self._prefill(plan)
            if not self._simulated:  # the whole phase, as the deadlines see it (adaptive schedulers learn from it)
                sched.record(plan, self.now() - start, self.now())
        start = self.now()
        step = sched.plan_decode(start)
        if step is not None:
            self._decode(step)
            if not self._simulated:
                sched.record(step, self.now() - start, self.now())
        return plan is not None or step is not None

    def run(self) -> None:
        """Run iterations until every submitted sequence has finished (waiting for arrivals still to come)."""
        while not self.scheduler.done:
            if not self.step():
                wait = self.scheduler.next_arrival_s() - self.now()
                if self._simulated:
                    self._t += max(wait, 0.0)
                elif wait > 0:
                    time.sleep(wait)

    # --------------------------------------------------------------- model calls
    @torch.no_grad()
    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any, sid: Any) -> list:
        """Greedy next tokens of ``ids`` (B, T) after ``cache``, with the subnet ``sid``; ``mask`` (B, L + T)."""
        device = next(self.model.parameters()).device
        out = self.model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            use_cache=True,
            logits_to_keep=1,
            subnet=self.subnets[sid],
            **{self._cache_kw: cache},
        )
        return out.logits[:, -1].argmax(-1).tolist()  # (B,)

    def _prefill(self, plan: Prefill) -> None:
        prompts = [self._prompts[i] for i in plan.seq_ids]
        length = max(p.numel() for p in prompts)
        ids = torch.stack([_pad_left(p, length, 0) for p in prompts])  # (n, T)
        mask = torch.stack([_pad_left(torch.ones_like(p), length, 0) for p in prompts])  # (n, T)
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, self.pad_token_id))
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # each sequence's own positions; padding at 0
        cache = self._new_cache()
        nxt = self._forward(ids, mask, positions, cache, plan.subnet_id)
        self._advance(self.scheduler.prefill_policy.profile, plan.subnet_id, plan.decision.profile_batch)
        self._join(cache, mask, list(plan.seq_ids))
        ended = self._record(plan.seq_ids, nxt)
        self.scheduler.finish_prefill(self.now(), plan, ended)
        self._leave()

    def _decode(self, step: DecodeStep) -> None:
        assert self._rows == list(step.seq_ids)  # the engine's rows follow the scheduler's running order
        last = torch.tensor([self._tokens[i][-1] for i in self._rows]).unsqueeze(1)  # (B, 1)
        self._mask = torch.cat([self._mask, self._mask.new_ones(len(self._rows), 1)], dim=1)  # (B, L + 1)
        positions = self._mask.sum(-1, keepdim=True) - 1  # (B, 1): the new token's position in its sequence
        nxt = self._forward(last, self._mask, positions, self._cache, step.subnet_id)
        self._advance(self.scheduler.decode_policy.profile, step.subnet_id, step.decision.profile_batch)
        ended = self._record(step.seq_ids, nxt)
        self.scheduler.finish_decode(self.now(), step, ended)
        self._leave()

    def _record(self, seq_ids: Sequence[int], nxt: list[int]) -> set[int]:
        ended = set()
        for i, tok in zip(seq_ids, nxt, strict=True):
            self._tokens[i].append(tok)
            if self._eos[i] is not None and tok == self._eos[i]:
                ended.add(i)
        return ended

    # --------------------------------------------------------------- the batched cache
    @staticmethod
    def _layers(cache: Any) -> list:
        """The cache layers holding tensors (a subnet's skipped layers hold none)."""
        return [layer for layer in cache.layers if getattr(layer, "keys", None) is not None and layer.keys.numel()]

    def _join(self, cache: Any, mask: torch.Tensor, seq_ids: list[int]) -> None:
        """Append the newcomers' cache rows (n, KV, T, d) to the running cache, left-padding the shorter one."""
        if self._cache is None:
            self._cache, self._mask, self._rows = cache, mask, seq_ids
            return
        length = max(self._mask.shape[1], mask.shape[1])
        for old, new in zip(self._layers(self._cache), self._layers(cache), strict=True):
            old.keys = torch.cat([_pad_left(old.keys, length, 2), _pad_left(new.keys, length, 2)])
            old.values = torch.cat([_pad_left(old.values, length, 2), _pad_left(new.values, length, 2)])
        self._mask = torch.cat([_pad_left(self._mask, length, 1), _pad_left(mask, length, 1)])
        self._rows = self._rows + seq_ids

    def _leave(self) -> None:
        """Drop the rows of finished sequences, then the columns that are padding in every remaining row."""
        running = self.scheduler.running
        if not running:
            self._cache, self._mask, self._rows = None, None, []
            return
        if tuple(self._rows) == running:
            return
        keep = torch.tensor([r for r, i in enumerate(self._rows) if i in set(running)])
        mask = self._mask[keep]
        start = int(mask.any(0).nonzero()[0])  # first column some sequence still attends to
        for layer in self._layers(self._cache):
            layer.keys = layer.keys[keep][:, :, start:]
            layer.values = layer.values[keep][:, :, start:]
        self._mask, self._rows = mask[:, start:], list(running)
