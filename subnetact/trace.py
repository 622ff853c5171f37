"""``trace_channels``: run a model once and find which channel dimensions its computation couples.

Why a recording forward and not ``torch.fx``: a real forward with an example input sees exactly what the model does
(data-dependent Python, asserts on input sizes, ``*args`` helpers), needs no tracing-friendly code, and costs one
forward. Module calls are seen through forward hooks; every ``torch`` function or tensor method between them through
a :class:`~torch.overrides.TorchFunctionMode`. Layers the pass can slice (``nn.Conv2d``, ``nn.Linear``,
``nn.BatchNorm2d``) are recorded as one node each and not entered.

The analysis runs while recording. Each tensor carries, per dimension, a *channel variable* or None. A variable is
born at the output dimension of a conv/linear layer (a producer) and travels through the operations that keep a
dimension's meaning (activations, norms, pooling, elementwise ops, permutes, reshapes that keep the dimension whole).
Two variables meeting in one elementwise op are the same channels (union-find); a grouped convolution joins its input
and output. Any operation the pass does not understand *freezes* every variable it reads, with a reason naming the
module path and the operation. A variable that stays unfrozen is an elastic channel group: every layer that reads it
is a conv/linear consumer, a norm, or an operation that maps channel k to channel k.

Shapes: the example input is whatever ``model(*args, **kwargs)`` accepts; nothing is kept after the trace except
sizes, paths and value ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode, _get_current_function_mode, _pop_mode, _push_mode

from .attention import is_attention
from .slimmable_norm import is_group_norm, is_layer_norm
from .tree import iter_tensors

# -- operation tables (by ``func.__name__``) -------------------------------------------------------------------------
_UNARY = frozenset(
    """relu relu_ relu6 hardtanh hardtanh_ gelu gelu_ silu silu_ sigmoid sigmoid_ hardswish hardswish_ hardsigmoid
    hardsigmoid_ tanh tanh_ dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout clone contiguous
    elu elu_ selu celu leaky_relu leaky_relu_ mish softplus abs neg __neg__ exp sqrt rsqrt square float half double
    bfloat16 to type_as detach clamp clamp_ clip clip_ sign erf log reciprocal __abs__""".split()
)
_ADDITIVE = frozenset("add add_ __add__ __radd__ __iadd__ sub sub_ __sub__ __rsub__ __isub__".split())
_MULTIPLICATIVE = frozenset(
    """mul mul_ __mul__ __rmul__ __imul__ div div_ __truediv__ __rtruediv__ __itruediv__ true_divide maximum
    minimum""".split()
)
_POOL = frozenset(
    "adaptive_avg_pool2d avg_pool2d max_pool2d adaptive_max_pool2d max_pool2d_with_indices lp_pool2d".split()
)
# Resample the spatial dimensions of (N, C, ...) inputs, channel by channel.
_RESAMPLE = frozenset("interpolate upsample upsample_nearest upsample_bilinear".split())
_REDUCE = frozenset("mean sum amax amin std var".split())
_RESHAPE = frozenset("flatten view reshape squeeze unsqueeze".split())
_ALONG_DIM = frozenset("softmax log_softmax".split())
_SHAPE_QUERIES = frozenset("size dim numel __get__ is_contiguous __len__ stride data_ptr element_size".split())
#: Tensor methods and properties that read neither the values nor the sizes of a weight (Hugging Face's
#: ``model.dtype`` calls ``is_floating_point`` on the first parameter): reading them outside the layer is harmless.
_METADATA = frozenset(
    """dtype device requires_grad is_leaf is_cuda layout grad grad_fn is_floating_point is_complex element_size
    data_ptr get_device is_sparse is_quantized is_meta itemsize ndim dim is_contiguous _version""".split()
)
#: Attributes holding a size that changes when convert slices the layer: Python code outside the layer that reads
#: one (``(8 / self.conv1.out_channels) ** .5``) would use the full size in the supernet and the narrow one in its
#: export.
_SIZE_ATTRIBUTES = {
    "conv": ("in_channels", "out_channels"),
    "linear": ("in_features", "out_features"),
    "norm": ("num_features",),
    "layernorm": ("normalized_shape",),
    "groupnorm": ("num_channels", "num_groups"),
    "attention": ("num_heads",),
}


class _Groups:
    """Union-find over channel variables, with per-root size, unit (whole groups of a grouped conv) and freeze
    reason."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []
        self.unit: list[int] = []
        self.frozen: dict[int, str] = {}

    def new(self, size: int, unit: int = 1) -> int:
        self.parent.append(len(self.parent))
        self.size.append(size)
        self.unit.append(unit)
        return len(self.parent) - 1

    def find(self, g: int) -> int:
        while self.parent[g] != g:
            self.parent[g] = self.parent[self.parent[g]]
            g = self.parent[g]
        return g

    def union(self, a: int, b: int, where: str) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        self.parent[rb] = ra
        self.unit[ra] = math.lcm(self.unit[ra], self.unit[rb])
        if rb in self.frozen and ra not in self.frozen:
            self.frozen[ra] = self.frozen[rb]
        if self.size[ra] != self.size[rb]:
            self.freeze(ra, f"{where} joins {self.size[ra]} and {self.size[rb]} channels")
        return ra

    def freeze(self, g: int, reason: str) -> None:
        self.frozen.setdefault(self.find(g), reason)

    def reason(self, g: int) -> str | None:
        return self.frozen.get(self.find(g))


@dataclass
class LayerUse:
    """How a sliceable layer met channel variables over all its calls."""

    kind: str  # "conv", "linear", "norm"
    outs: list[int] = field(default_factory=list)
    ins: list[int] = field(default_factory=list)
    calls: int = 0


@dataclass
class ModuleCall:
    """One call of a non-leaf module: its input/output value ids and the value-id range created inside it."""

    path: str
    inputs: list[int | None]
    output: int | None
    first_value: int
    last_value: int = -1
    same_shape: bool = False


@dataclass
class ChannelTrace:
    """What one recorded forward found (see the module docstring)."""

    groups: _Groups
    layers: dict[str, LayerUse]
    calls: list[ModuleCall]
    call_counts: dict[str, int]
    producers: dict[int, tuple[str, tuple[int | None, ...]]]  # value id -> (op name, input value ids)
    output: Any
    attentions: dict[str, int] = field(default_factory=dict)  # attention module path -> calls (heads sliceable)
    # layer path -> how code outside the layer reads its weights or sizes (the layer must keep its full width)
    outside: dict[str, str] = field(default_factory=dict)
    # layer path -> (channels, why) for conv/linear layers of a type convert cannot slice (Conv1d, parametrized)
    unsliced: dict[str, tuple[int, str]] = field(default_factory=dict)


#: BatchNorm2d subclasses whose forward is BatchNorm2d's followed by their ``drop`` and ``act`` modules (by qualified
#: name, so timm is not imported). :class:`~subnetact.SubnetNorm` keeps those modules running after the sliced norm.
NORM_ACT_CLASSES = {"timm.layers.norm_act.BatchNormAct2d"}


def _is_norm_act(module: nn.Module) -> bool:
    cls = type(module)
    return (
        isinstance(module, nn.BatchNorm2d)
        and f"{cls.__module__}.{cls.__qualname__}" in NORM_ACT_CLASSES
        and set(module._modules) <= {"drop", "act"}
    )


def sliceable_kind(module: nn.Module) -> str | None:
    """ "conv" / "linear" / "norm" (BatchNorm) / "layernorm" / "groupnorm" for the layers convert can turn into
    operators, else None."""
    if type(module) is nn.Conv2d:
        return "conv"
    if type(module) is nn.Linear:
        return "linear"
    if type(module) is nn.BatchNorm2d or _is_norm_act(module):
        return "norm"
    if is_layer_norm(module):
        return "layernorm"
    if is_group_norm(module):
        return "groupnorm"
    return None


_OPAQUE_LEAVES = (
    nn.modules.conv._ConvNd,
    nn.Linear,
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.MultiheadAttention,
    nn.Embedding,
    nn.RNNBase,
)

#: Modules whose inference forward can run one fused kernel on their children's full Parameters instead of calling
#: the children (``nn.TransformerEncoderLayer``'s fast path, taken in eval under no_grad but never inside the trace):
#: slicing anything inside them would be silently ignored, so the trace treats them as one layer it cannot slice.
_FUSED_FAST_PATH = (nn.TransformerEncoderLayer,)


def _watched_class(cls: type, names: tuple[str, ...]) -> type:
    """A subclass of ``cls`` whose attributes ``names`` report each read to the instance's ``_subnetact_watch``
    callback (if set) and otherwise behave as plain instance attributes. Cached per ``(cls, names)``."""
    key = (cls, names)
    sub = _WATCHED_CLASSES.get(key)
    if sub is None:

        def watched(name: str) -> property:
            def get(self: nn.Module) -> Any:
                watch = self.__dict__.get("_subnetact_watch")
                if watch is not None:
                    watch(self, name)
                return self.__dict__[name]

            def put(self: nn.Module, value: Any) -> None:
                self.__dict__[name] = value

            return property(get, put)

        body: dict[str, Any] = {name: watched(name) for name in names}
        body.update(__module__=cls.__module__, __qualname__=cls.__qualname__)
        sub = _WATCHED_CLASSES[key] = type(cls.__name__, (cls,), body)
    return sub


_WATCHED_CLASSES: dict[tuple[type, tuple[str, ...]], type] = {}


class _Recorder(TorchFunctionMode):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.paths = {id(m): name for name, m in model.named_modules()}
        # Classified before the trace swaps classes (see ``watch``): id(module) -> sliceable kind / attention flag.
        self.kinds = {id(m): sliceable_kind(m) for m in model.modules()}
        self.attention_ids = {id(m) for m in model.modules() if is_attention(m)}
        # id(parameter or buffer) -> (its name, the path of the sliceable layer or attention holding it)
        self.owned: dict[int, tuple[str, str]] = {}
        for path, m in model.named_modules():
            if self.kinds[id(m)] is not None or id(m) in self.attention_ids:
                for name, t in [*m.named_parameters(), *m.named_buffers()]:
                    self.owned.setdefault(id(t), (f"{path}.{name}" if path else name, path))
        self.outside: dict[str, str] = {}
        for path, m in model.named_modules():
            if any(type(h).__name__ == "WeightNorm" for h in m._forward_pre_hooks.values()):
                self.outside[path] = (
                    f"{path or '<root>'!r} recomputes its weight on every call (torch.nn.utils.weight_norm), so its "
                    "sliced weight would not be read; call torch.nn.utils.remove_weight_norm on it before convert"
                )
        # layer path -> (channels, why it cannot be sliced) for conv/linear layers of a type convert does not slice
        self.unsliced: dict[str, tuple[int, str]] = {}
        self._in_hook = False
        self.groups = _Groups()
        self.layers: dict[str, LayerUse] = {}
        self.calls: list[ModuleCall] = []
        self.call_counts: dict[str, int] = {}
        self.producers: dict[int, tuple[str, tuple[int | None, ...]]] = {}
        self.attentions: dict[str, int] = {}
        self._key: dict[int, int] = {}  # id(tensor) -> latest value id (in-place ops rebind)
        self._dims: dict[int, tuple[int | None, ...]] = {}
        self._alive: list[torch.Tensor] = []  # keeps ids unique for the whole trace
        self._stack: list[tuple[nn.Module, ModuleCall | None]] = []
        self._leaf_depth = 0
        self._mode_off = False  # the mode is popped off the stack while a leaf runs (see ``pre_hook``)

    # -- values ------------------------------------------------------------------------------------------------------
    def key(self, t: torch.Tensor) -> int | None:
        return self._key.get(id(t))

    def dims(self, t: torch.Tensor) -> tuple[int | None, ...]:
        k = self.key(t)
        return (None,) * t.dim() if k is None else self._dims[k]

    def bind(self, t: torch.Tensor, dims: tuple[int | None, ...], op: str, inputs: tuple[int | None, ...]) -> None:
        k = len(self.producers)
        self.producers[k] = (op, inputs)
        self._key[id(t)] = k
        self._dims[k] = tuple(dims) if len(dims) == t.dim() else (None,) * t.dim()
        self._alive.append(t)

    @property
    def where(self) -> str:
        for module, _ in reversed(self._stack):
            path = self.paths.get(id(module), "?")
            return path or "<root>"
        return "<root>"

    def freeze_all(self, tensors: list[torch.Tensor], reason: str) -> None:
        for t in tensors:
            for g in self.dims(t):
                if g is not None:
                    self.groups.freeze(g, reason)

    # -- reads of a layer's weights or sizes outside the layer --
    def read_outside(self, path: str, what: str, operation: str) -> None:
        """Code outside the layer at ``path`` read ``what`` (one of its parameters or size attributes)."""
        if path not in self.outside:
            self.outside[path] = f"{what!r} is read outside {path or '<root>'!r} at {self.where!r} ({operation})"

    def watch(self, module: nn.Module, name: str) -> None:
        """The ``_subnetact_watch`` callback of a watched layer (see :func:`_watched_class`)."""
        if self._leaf_depth == 0 and not self._in_hook:  # inside a leaf: the layer's own forward (or its owner's)
            path = self.paths.get(id(module), "?")
            self.read_outside(path, f"{path}.{name}" if path else name, "a Python read of its size")

    def start_watching(self, model: nn.Module) -> list[tuple[nn.Module, type]]:
        """Swap each sliceable layer's class for a watched subclass (see :func:`_watched_class`); returns what
        :meth:`stop_watching` restores."""
        swapped = []
        for m in model.modules():
            kind = "attention" if id(m) in self.attention_ids else self.kinds[id(m)]
            names = tuple(n for n in _SIZE_ATTRIBUTES.get(kind, ()) if n in m.__dict__)
            if names:
                swapped.append((m, type(m)))
                m.__class__ = _watched_class(type(m), names)
                m.__dict__["_subnetact_watch"] = self.watch
        return swapped

    @staticmethod
    def stop_watching(swapped: list[tuple[nn.Module, type]]) -> None:
        for m, cls in swapped:
            m.__class__ = cls
            m.__dict__.pop("_subnetact_watch", None)

    def params_read(self, name: str, func: Any, args: tuple, kwargs: dict) -> None:
        """Record every weight of a sliceable layer that ``func`` reads (the trace only sees reads outside leaves)."""
        if name == "__get__":
            name = getattr(getattr(func, "__self__", None), "__name__", name)  # the property: shape, data, T, ...
        if name in _METADATA:
            return
        owned = self.owned
        for a in (*args, *kwargs.values()):
            # Most calls take tensors (or a list of them, for cat) directly: a flat scan, not _tensors' recursion.
            for t in a if isinstance(a, (list, tuple)) else (a,):
                owner = owned.get(id(t)) if isinstance(t, torch.Tensor) else None
                if owner is not None:
                    self.read_outside(owner[1], owner[0], name)

    # -- module hooks --
    def pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._in_hook = True
        try:
            self._pre_hook(module, args, kwargs)
        finally:
            self._in_hook = False

    def post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        self._in_hook = True
        try:
            self._post_hook(module, args, kwargs, output)
        finally:
            self._in_hook = False

    def _pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        path = self.paths.get(id(module), "?")
        self.call_counts[path] = self.call_counts.get(path, 0) + 1
        if (
            self._leaf_depth
            or isinstance(module, (*_OPAQUE_LEAVES, *_FUSED_FAST_PATH))
            or id(module) in self.attention_ids
        ):
            if self._leaf_depth == 0:
                # A leaf runs outside the mode, as in a plain forward: some leaves pick their kernels by whether a
                # mode is active (nn.MultiheadAttention's and nn.TransformerEncoderLayer's fused fast paths), and
                # convert uses the trace's output as the original model's output, bit for bit.
                self.mode_off()
            self._leaf_depth += 1
            self._stack.append((module, None))
            return
        tensors = list(iter_tensors((args, kwargs)))
        call = ModuleCall(path, [self.key(t) for t in tensors], None, len(self.producers))
        self.calls.append(call)
        self._stack.append((module, call))

    def _post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        _, call = self._stack.pop()
        if call is None:
            self._leaf_depth -= 1
            if self._leaf_depth == 0:
                self.mode_on()
                self.leaf(module, list(iter_tensors((args, kwargs))), output)
            return
        outs = list(iter_tensors(output))
        ins = list(iter_tensors((args, kwargs)))
        call.output = self.key(outs[0]) if len(outs) == 1 else None
        call.last_value = len(self.producers)
        call.same_shape = len(ins) == 1 and len(outs) == 1 and ins[0].shape == outs[0].shape

    def mode_off(self) -> None:
        if _get_current_function_mode() is self:
            _pop_mode()
            self._mode_off = True

    def mode_on(self) -> None:
        if self._mode_off:
            _push_mode(self)
            self._mode_off = False

    # -- leaves --
    def leaf(self, module: nn.Module, inputs: list[torch.Tensor], output: Any) -> None:
        path = self.paths.get(id(module), "?")
        kind = self.kinds.get(id(module))
        outs = list(iter_tensors(output))
        in_keys = tuple(self.key(t) for t in inputs)
        if id(module) in self.attention_ids:
            # Its heads are its own channel group (subnetact.attention); it reads and writes the stream whole.
            self.attentions[path] = self.attentions.get(path, 0) + 1
            self.freeze_all(inputs, f"{type(module).__name__} at {path!r} reads them whole (it slices its heads)")
            for t in outs:
                self.bind(t, (None,) * t.dim(), type(module).__name__, in_keys)
            return
        if kind is None or len(inputs) != 1 or len(outs) != 1:
            reason = f"{type(module).__name__} at {path!r} is not a layer convert can slice"
            if isinstance(module, _FUSED_FAST_PATH):
                reason += " (in inference its fast path runs one fused kernel on its layers' full weights)"
            elif isinstance(module, (nn.modules.conv._ConvNd, nn.Linear)) and outs and outs[0].dim():
                parametrizations = getattr(module, "parametrizations", None)
                if parametrizations is not None:
                    kinds = sorted({type(p).__name__ for plist in parametrizations.values() for p in plist})
                    reason += (
                        f" (its {', '.join(map(repr, parametrizations))} is computed by a parametrization: "
                        f"{', '.join(kinds)}; torch.nn.utils.parametrize.remove_parametrizations first)"
                    )
                else:
                    reason += " (convert slices nn.Conv2d and nn.Linear layers)"
                channel = -1 if isinstance(module, nn.Linear) else 1
                self.unsliced.setdefault(path, (outs[0].shape[channel], reason))
            self.freeze_all(inputs, reason)
            for t in outs:
                self.bind(t, (None,) * t.dim(), type(module).__name__, in_keys)
            return
        x, y = inputs[0], outs[0]
        use = self.layers.setdefault(path, LayerUse(kind))
        use.calls += 1
        dims = list(self.dims(x))
        if kind in ("layernorm", "groupnorm"):
            # Slimmable semantics (subnetact.slimmable_norm): normalises over the active channels of its group;
            # GroupNorm keeps whole groups of C / G channels.
            channel = -1 if kind == "layernorm" else 1
            g = dims[channel] if x.dim() >= 2 else None
            if g is not None:
                if kind == "groupnorm":
                    unit = self.groups.new(x.shape[1], unit=module.num_channels // module.num_groups)
                    g = dims[channel] = self.groups.union(g, unit, f"GroupNorm {path!r}")
                use.ins.append(g)
            self.bind(y, dims, kind, in_keys)
            return
        if kind == "norm":
            if x.dim() != 4:
                self.freeze_all([x], f"{type(module).__name__} at {path!r} got a {x.dim()}-D input")
            elif dims[1] is not None:
                use.ins.append(dims[1])
            self.bind(y, dims, "norm", in_keys)
            return
        channel = 1 if kind == "conv" else -1
        g_in = dims[channel] if x.dim() else None
        out_size = y.shape[channel]
        if kind == "conv" and module.groups > 1:
            per_group = module.in_channels // module.groups
            g_out = self.groups.new(out_size, unit=per_group)
            if module.in_channels != module.out_channels or g_in is None:
                why = (
                    f"grouped convolution {path!r} maps {module.in_channels} to {module.out_channels} channels"
                    if g_in is not None
                    else f"grouped convolution {path!r} reads channels that are not elastic"
                )
                self.groups.freeze(g_out, why)
                if g_in is not None:
                    self.groups.freeze(g_in, why)
            else:
                g_out = self.groups.union(g_in, g_out, f"grouped convolution {path!r}")
        else:
            g_out = self.groups.new(out_size)
        if g_in is not None:
            use.ins.append(g_in)
        use.outs.append(g_out)
        dims[channel] = g_out
        self.bind(y, dims, kind, in_keys)

    # -- functions --
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._leaf_depth == 0:
            name = getattr(func, "__name__", "?")
            if self.owned and not self._in_hook:
                self.params_read(name, func, args, kwargs)
            if name not in _SHAPE_QUERIES:
                self.function(name, args, kwargs, out)
        return out

    def function(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        outs = list(iter_tensors(out))
        if not outs:
            return
        inputs = list(iter_tensors((args, kwargs)))
        in_keys = tuple(self.key(t) for t in inputs)
        where = f"{name} at {self.where!r}"
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        dims: tuple[int | None, ...] | None = None
        if first is not None and len(outs) == 1:
            if name in _UNARY:
                dims = self.dims(first) if outs[0].shape == first.shape else None
            elif name in _ADDITIVE or name in _MULTIPLICATIVE:
                dims = self.elementwise(name in _ADDITIVE, args, outs[0], where)
            elif name in _POOL and first.dim() == 4:
                dims = (*self.dims(first)[:2], None, None)
            elif name in _RESAMPLE and first.dim() >= 3:
                dims = (*self.dims(first)[:2], *(None,) * (first.dim() - 2))
            elif name in _REDUCE:
                dims = self.reduce(first, args, kwargs, outs[0], where)
            elif name in _RESHAPE or name == "expand":
                dims = self.reshape(first, outs[0], where)
            elif name in ("permute", "transpose", "swapaxes"):
                dims = self.permute(name, first, args, kwargs, outs[0])
            elif name == "__getitem__":
                dims = self.getitem(first, args[1], outs[0], where)
            elif name in _ALONG_DIM:
                dims = self.along_dim(first, args, kwargs, where)
            elif name == "layer_norm":
                shape = args[1] if len(args) > 1 else kwargs["normalized_shape"]
                d = list(self.dims(first))
                for g in d[len(d) - len(tuple(shape)) :]:
                    if g is not None:
                        self.groups.freeze(g, f"LayerNorm ({where}) normalises over these channels")
                dims = tuple(d)
        if dims is None:
            self.freeze_all(inputs, f"{where} is an operation convert cannot slice through")
        for t in outs:
            if t is first and dims is None:
                dims = (None,) * t.dim()
            self.bind(t, dims if dims is not None and len(outs) == 1 else (None,) * t.dim(), name, in_keys)

    def elementwise(self, additive: bool, args: tuple, out: torch.Tensor, where: str) -> tuple[int | None, ...]:
        operands = [a for a in args[:2] if isinstance(a, torch.Tensor)]
        result: list[int | None] = [None] * out.dim()
        for j in range(out.dim()):
            found, plain = [], False
            for t in operands:
                i = t.dim() - out.dim() + j  # broadcasting aligns from the right
                if i < 0 or t.shape[i] == 1:
                    continue
                g = self.dims(t)[i]
                if g is None:
                    plain = True
                else:
                    found.append(g)
            if not found:
                continue
            g = found[0]
            for other in found[1:]:
                g = self.groups.union(g, other, where)
            if additive and len(found) > 1:
                self.groups.freeze(g, f"residual stream ({where} adds two of them)")
            if plain:
                self.groups.freeze(g, f"{where} mixes them with a tensor that is not sliced")
            result[j] = g
        return tuple(result)

    def reduce(self, x, args, kwargs, out, where) -> tuple[int | None, ...] | None:
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if dim is None:
            return None
        reduced = {d % x.dim() for d in ((dim,) if isinstance(dim, int) else tuple(dim))}
        dims = self.dims(x)
        for d in reduced:
            if dims[d] is not None:
                self.groups.freeze(dims[d], f"{where} reduces over these channels")
        keep = kwargs.get("keepdim", args[2] if len(args) > 2 and isinstance(args[2], bool) else False)
        return tuple(None if i in reduced else g for i, g in enumerate(dims) if keep or i not in reduced)

    def reshape(self, x: torch.Tensor, out: torch.Tensor, where: str) -> tuple[int | None, ...]:
        # A dimension survives a reshape iff some output dimension has its size and the same product of sizes in
        # front of it (row-major order: then channel c lands at index c of that dimension).
        result: list[int | None] = [None] * out.dim()
        for d, g in enumerate(self.dims(x)):
            if g is None:
                continue
            before = math.prod(x.shape[:d])
            match = next(
                (
                    e
                    for e in range(out.dim())
                    if out.shape[e] == x.shape[d] and math.prod(out.shape[:e]) == before and result[e] is None
                ),
                None,
            )
            if match is None:
                self.groups.freeze(g, f"{where} reshapes them into other dimensions")
            else:
                result[match] = g
        return tuple(result)

    def permute(self, name, x, args, kwargs, out) -> tuple[int | None, ...]:
        dims = self.dims(x)
        n = x.dim()
        if name == "permute":
            order = args[1:] if len(args) > 2 or (len(args) == 2 and isinstance(args[1], int)) else args[1]
            if len(args) == 1:
                order = kwargs["dims"]
            order = [d % n for d in order]
        else:
            a, b = (args[1] % n, args[2] % n) if len(args) > 2 else (kwargs["dim0"] % n, kwargs["dim1"] % n)
            order = list(range(n))
            order[a], order[b] = order[b], order[a]
        return tuple(dims[d] for d in order)

    def getitem(self, x: torch.Tensor, index: Any, out: torch.Tensor, where: str) -> tuple[int | None, ...] | None:
        index = index if isinstance(index, tuple) else (index,)
        if any(not (i is None or i is Ellipsis or isinstance(i, (int, slice))) for i in index):
            return None
        dims = list(self.dims(x))
        explicit = sum(1 for i in index if i is not None and i is not Ellipsis)
        expanded: list[Any] = []
        for i in index:
            if i is Ellipsis:
                expanded += [slice(None)] * (x.dim() - explicit)
            else:
                expanded.append(i)
        expanded += [slice(None)] * (x.dim() - sum(1 for i in expanded if i is not None))
        result: list[int | None] = []
        d = 0
        for i in expanded:
            if i is None:
                result.append(None)
                continue
            g = dims[d]
            if isinstance(i, int):
                if g is not None:
                    self.groups.freeze(g, f"{where} picks one of these channels")
            else:
                if g is not None and i != slice(None):
                    self.groups.freeze(g, f"{where} slices these channels")
                result.append(g)
            d += 1
        return tuple(result) if len(result) == out.dim() else None

    def along_dim(self, x, args, kwargs, where) -> tuple[int | None, ...]:
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        dims = self.dims(x)
        if dim is None or dims[dim % x.dim()] is not None:
            for g in dims:
                if g is not None:
                    self.groups.freeze(g, f"{where} normalises over these channels")
        return dims


def trace_channels(model: nn.Module, args: tuple, kwargs: dict) -> ChannelTrace:
    """Run ``model(*args, **kwargs)`` once under ``torch.no_grad`` and return what it found.

    The caller puts the model in eval mode first (so the forward has no side effects) and restores it after.
    """
    recorder = _Recorder(model)
    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(recorder.pre_hook, with_kwargs=True))
        handles.append(module.register_forward_hook(recorder.post_hook, with_kwargs=True))
    swapped = recorder.start_watching(model)
    try:
        with torch.no_grad(), recorder:
            try:
                output = model(*args, **kwargs)
            finally:
                recorder.mode_on()  # a leaf that raised left the mode off; ``with`` pops it again
    finally:
        recorder.stop_watching(swapped)
        for h in handles:
            h.remove()
    for t in iter_tensors(output):
        for g in recorder.dims(t):
            if g is not None:
                recorder.groups.freeze(g, "they reach the model's output")
    # A layer whose weights or sizes other code reads keeps its full width: the supernet would run that code on the
    # full layer while an export of a narrower subnet runs it on the narrow one (a tied decoder, F.linear(x,
    # self.fc1.weight), a scale computed from self.conv1.out_channels).
    for path, reason in recorder.outside.items():
        use = recorder.layers.get(path)
        for g in [] if use is None else use.outs + use.ins:
            # This reason wins over an earlier one: it is the cause (the tensor read outside is what the earlier
            # operation found unsliced).
            recorder.groups.frozen[recorder.groups.find(g)] = reason
    return ChannelTrace(
        recorder.groups,
        recorder.layers,
        recorder.calls,
        recorder.call_counts,
        recorder.producers,
        output,
        recorder.attentions,
        recorder.outside,
        recorder.unsliced,
    )


def is_residual(trace: ChannelTrace, call: ModuleCall) -> bool:
    """Whether ``call`` computes ``y = x + f(x)`` (possibly followed by activations) from its one input ``x``.

    Walks back from the output through activations and additions; at least one addition must take ``x`` itself on
    one side and, on the other, a value computed inside the call from ``x``.
    """
    x = call.inputs[0] if len(call.inputs) == 1 else None
    if x is None or call.output is None or not call.same_shape or call.output == x:
        return False

    def depends_on_x(v: int | None) -> bool:
        seen, todo = set(), [v]
        while todo:
            u = todo.pop()
            if u == x:
                return True
            if u is None or u in seen or u < call.first_value:
                continue
            seen.add(u)
            todo.extend(trace.producers[u][1])
        return False

    def stream(v: int | None, added: bool) -> bool:
        if v == x:
            return added
        if v is None or v < call.first_value:
            return False
        op, ins = trace.producers[v]
        if op in _UNARY and len(ins) >= 1:
            return stream(ins[0], added)
        if op in _ADDITIVE and len(ins) == 2:
            a, b = ins
            return (stream(a, True) and depends_on_x(b)) or (stream(b, True) and depends_on_x(a))
        return False

    return stream(call.output, False)
