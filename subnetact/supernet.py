"""The methods a converted model gains: ``actuate``, ``space``, ``active``, ``export`` and ``forward(subnet=...)``.

``convert`` changes the class of the model's root module to a subclass of its own class with this mixin first in
the MRO, so the model stays an instance of its original class (``isinstance(model, torchvision.models.ResNet)``).
"""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .config import SubnetConfig
from .errors import ArgumentTypeError, InvalidSubnetError
from .space import Space
from .state import ActuationState, state_of  # noqa: F401  (state_of: kept importable from here)
from .weight_cache import WeightCacheInfo, check_budget_mb, default_budget_bytes

_CLASS_CACHE: dict[type, type] = {}


class SupernetMixin:
    """Mixed into the root of a converted model. See :func:`subnetact.convert`."""

    _subnetact: ActuationState
    _subnetact_base: type

    def forward(self, *args: Any, subnet: SubnetConfig | None = None, **kwargs: Any) -> Any:
        """Run the active subnet, or ``subnet`` for this call only (thread-safe: other threads are unaffected).

        Args:
            *args, **kwargs: the original model's inputs.
            subnet: optional config to run instead of the active one, without changing the active one.
        """
        state = self._subnetact
        local = state.local
        pinned = getattr(local, "plan", None)
        if subnet is not None:
            plan = state.plan_for(subnet if isinstance(subnet, SubnetConfig) else SubnetConfig.from_dict(subnet))
        elif pinned is not None:
            plan = pinned  # a forward inside a pinned region (calibration, or a model that calls itself)
        else:
            plan = state.default
        if pinned is None and plan.calibrated and not self.training and not torch.is_grad_enabled():
            # A registered subnet served (not calibrating): copies of its strided weight slices, within the budget.
            state.weight_cache.use(plan)
        local.plan = plan
        try:
            return super().forward(*args, **kwargs)
        finally:
            local.plan = pinned

    @property
    def space(self) -> Space:
        """The subnets this model can actuate."""
        return self._subnetact.space

    @property
    def active(self) -> SubnetConfig:
        """The config ``model(x)`` runs."""
        return self._subnetact.default_config

    @property
    def registered_subnets(self) -> tuple[SubnetConfig, ...]:
        """Subnets with calibrated SubnetNorm statistics (the served set), in registration order."""
        return tuple(self._subnetact.stats)

    def actuate(
        self,
        config: SubnetConfig | Mapping[str, Sequence[float]] | None = None,
        *,
        depth: int | Sequence[int] | None = None,
        width: float | Sequence[float] | None = None,
        **dims: Any,
    ) -> SubnetConfig:
        """Switch the model to a subnet, in place. O(1) for a config seen before: one reference swap.

        Args:
            config: a :class:`SubnetConfig` (or its ``to_dict()`` form). Mutually exclusive with the keywords.
            depth: blocks per stage: an int for every stage or one int per stage.
            width: channel fraction per block: a float for every block or one float per block. Where the space
                links ``width`` to several dimensions (a transformer's ``heads`` and ``ffn``), it sets them all.
            **dims: further dimensions (or links) the space defines. Dimensions not given keep their active values.

        Returns:
            The config now active (values snapped to the space's exact choices).

        Raises:
            InvalidSubnetError: (a ``ValueError``) naming the dimension, the value and the allowed values. The
                model stays on its previous subnet.

        Example::

            >>> model.actuate(depth=[2, 3, 4, 2], width=0.5)
            >>> model.actuate(model.space.min())
        """
        state = self._subnetact
        keywords = {k: v for k, v in (("depth", depth), ("width", width), *dims.items()) if v is not None}
        if config is not None:
            if keywords:
                raise InvalidSubnetError(
                    f"pass either a config or keywords ({', '.join(keywords)}), not both; got config={config!r}"
                )
            if not isinstance(config, SubnetConfig):
                if not isinstance(config, Mapping):
                    raise InvalidSubnetError(
                        f"config={config!r} must be a SubnetConfig or a mapping of dimension -> values"
                    )
                config = SubnetConfig.from_dict(config)
        elif keywords:
            # Keyword calls repeat (a server cycles through a few subnets): memoise the validated config per
            # (active config, keywords), so they cost a dict lookup instead of a validation of every entry.
            cache = state.keyword_configs
            key = _keyword_key(state.default_config, keywords)
            config = None if key is None else cache.get(key)
            if config is None:
                merged: dict[str, Any] = dict(state.default_config.items())
                merged.update(state.space.expand_links(keywords))  # e.g. width= -> heads= and ffn= (Space links)
                config = state.space.make(**merged)
                if key is not None:
                    if len(cache) >= _KEYWORD_CACHE_SIZE:
                        cache.clear()
                    cache[key] = config
        else:
            raise InvalidSubnetError("actuate() needs a config or at least one of depth=, width=")
        return state.activate(config).config

    def set_weight_cache(self, mb: float | None = None) -> None:
        """Set the memory budget of the weight cache, in MB (1e6 bytes); ``None`` restores the default, ``0`` turns it
        off. Copies over a smaller budget are dropped now, least recently run subnets first.

        The cache keeps contiguous copies of the strided weight slices that registered subnets pass to convolutions
        (see :mod:`subnetact.weight_cache`), so a served subnet runs as fast as its extracted model. The default is
        8 % of the operators' parameter and buffer bytes (15 MB for OFA-ResNet50), which keeps the memory claim of
        ``docs/benchmarks.md``; ``docs/benchmarks.md`` records forward time against the budget.

        Args:
            mb: budget in MB, >= 0, or None for the default.

        Raises:
            ConfigError: (a ``ValueError``) ``mb`` is negative, not finite, not a number, or a bool.

        Example::

            >>> model.set_weight_cache(100)  # up to 100 MB of copies
            >>> model.weight_cache_info().used_bytes
        """
        check_budget_mb(mb, "set_weight_cache: mb")
        state = self._subnetact
        budget = default_budget_bytes(state.ops) if mb is None else int(mb * 1e6)
        state.weight_cache.set_budget(budget, default=mb is None)

    def weight_cache_info(self) -> WeightCacheInfo:
        """The weight cache's budget, the bytes it uses and the subnets it holds copies for
        (:class:`~subnetact.weight_cache.WeightCacheInfo`)."""
        return self._subnetact.weight_cache.info()

    def export(self, config: SubnetConfig | None = None) -> nn.Module:
        """The subnet as a plain, independent module (e.g. a ``torchvision.models.ResNet``); see
        :func:`subnetact.export`."""
        from .export import export

        return export(self, config)

    # -- keeping plans valid -------------------------------------------------------------------------------------
    def _apply(self, fn, recurse=True):  # called by .to(), .cuda(), .half(), ...
        result = super()._apply(fn, recurse)
        state = self._subnetact
        state.stats = {cfg: fn(t) for cfg, t in state.stats.items()}
        state.invalidate()  # plans hold views of the tensors that were just replaced
        return result

    def load_state_dict(self, state_dict, strict=True, assign=False):
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._subnetact.invalidate()
        return result

    def __deepcopy__(self, memo: dict) -> SupernetMixin:
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = copy.deepcopy(value, memo)
        new._subnetact.invalidate()
        return new

    def __reduce_ex__(self, protocol):
        raise ArgumentTypeError(
            "a converted model cannot be pickled; use subnetact.save(model, path) and subnetact.load"
        )


class GenerateMixin:
    """Mixed in before :class:`SupernetMixin` for models with a ``generate`` method (Hugging Face decoders)."""

    _subnetact: ActuationState

    def generate(self, *args: Any, subnet: SubnetConfig | Mapping | None = None, **kwargs: Any) -> Any:
        """The model's own ``generate``, running ``subnet`` (default: the active one) for every forward it makes.

        Like ``model(x, subnet=cfg)`` it is thread-safe: the subnet is pinned in the calling thread for the whole
        call, so other threads (and the default subnet) are unaffected.

        Raises:
            InvalidSubnetError: (a ``ValueError``) ``subnet`` is not a subnet of the space; nothing ran.
        """
        if subnet is None:
            return super().generate(*args, **kwargs)
        state = self._subnetact
        plan = state.plan_for(subnet if isinstance(subnet, SubnetConfig) else SubnetConfig.from_dict(subnet))
        local = state.local
        pinned = getattr(local, "plan", None)
        local.plan = plan
        try:
            return super().generate(*args, **kwargs)
        finally:
            local.plan = pinned


def _forward_with_signature(base: type) -> Any:
    """``SupernetMixin.forward`` carrying ``base.forward``'s signature plus ``subnet``, or None.

    Hugging Face's ``generate`` inspects the forward's signature to decide which inputs to build
    (``position_ids`` for left-padded prompts, ``attention_mask``); ``(*args, subnet, **kwargs)`` would hide them.
    """
    try:
        signature = inspect.signature(base.forward)
    except (TypeError, ValueError):
        return None
    params = list(signature.parameters.values())
    if "subnet" in signature.parameters:
        return None
    subnet = inspect.Parameter("subnet", inspect.Parameter.KEYWORD_ONLY, default=None)
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    params.insert(at, subnet)

    def forward(self: SupernetMixin, *args: Any, subnet: SubnetConfig | None = None, **kwargs: Any) -> Any:
        return SupernetMixin.forward(self, *args, subnet=subnet, **kwargs)

    forward.__doc__ = SupernetMixin.forward.__doc__
    forward.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return forward


_KEYWORD_CACHE_SIZE = 1024


def _keyword_key(active: SubnetConfig, keywords: dict[str, Any]) -> tuple | None:
    """A hashable key for ``actuate(**keywords)`` from ``active``, or None (unhashable values: no memo).

    Values are keyed with their types, so ``True`` never hits the entry of ``1`` (bools are refused by validation).
    """

    def freeze(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return tuple((type(x), x) for x in v)
        return (type(v), v)

    key = (active, tuple(sorted((k, freeze(v)) for k, v in keywords.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def to_supernet(model: nn.Module, state: ActuationState) -> None:
    """Make ``model``'s root a supernet root: its class becomes :func:`supernet_class` of its class, holding
    ``state`` (what :func:`~subnetact.state.state_of` returns)."""
    model.__class__ = supernet_class(type(model))
    model._subnetact = state
    _keep_output_recording(model)


def _keep_output_recording(model: nn.Module) -> None:
    """Keep ``output_hidden_states=True`` / ``output_attentions=True`` working on a converted Hugging Face model.

    transformers (>= 5) records a model's hidden states and attentions with hooks chosen by a registry keyed on the
    model's class *name*, filled when the model is constructed; the supernet class has a new name, so without an
    entry of its own the request is silently ignored (no ``hidden_states`` in the outputs).
    """
    capturing = sys.modules.get("transformers.utils.output_capturing")  # imported by any transformers model
    registry = getattr(capturing, "_CAN_RECORD_REGISTRY", None)
    recordable = getattr(model, "_can_record_outputs", None)
    if registry is not None and recordable:
        # Keyed on str(model.__class__) in every release since 5.0; 5.9's registry is a plain dict indexed by that
        # string, later ones a dict subclass whose __setitem__ takes the model. dict.__setitem__ serves both.
        dict.__setitem__(registry, str(model.__class__), recordable)


def from_supernet(model: nn.Module) -> None:
    """Undo :func:`to_supernet` (a no-op on a model it was not applied to): the root's original class, no state."""
    base = getattr(type(model), "_subnetact_base", None)
    if base is not None and isinstance(model, SupernetMixin):
        model.__class__ = base
    model.__dict__.pop("_subnetact", None)


def supernet_class(base: type) -> type:
    """The converted-root class for ``base`` (one per base class, so ``type(a) is type(b)`` for two ResNets)."""
    cls = _CLASS_CACHE.get(base)
    if cls is None:
        # Generative models (Hugging Face's GenerationMixin) also take ``subnet=`` in ``generate``.
        namespace: dict[str, Any] = {"_subnetact_base": base}
        mixins: tuple[type, ...] = (SupernetMixin,)
        if callable(getattr(base, "generate", None)):
            mixins = (GenerateMixin, SupernetMixin)
            forward = _forward_with_signature(base)
            if forward is not None:
                namespace["forward"] = forward
        cls = type(f"Supernet{base.__name__}", (*mixins, base), namespace)
        cls.__module__ = __name__
        _CLASS_CACHE[base] = cls
    return cls
