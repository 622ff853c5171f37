"""``save`` / ``load``: one safetensors file holding the weights, the registered statistics and, in its metadata, the
space and the registered subnets as JSON.

The sha256 in the metadata covers the tensor data *and* the JSON header (format version 2), so a damaged or edited
header (another valid ``active`` subnet, a dropped subnet) is refused like damaged tensor data. Version 1 files, whose
checksum covers the tensors only, are still read.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checks import is_int
from .config import SubnetConfig
from .errors import ArgumentTypeError, CheckpointError, ConfigError
from .space import Space
from .supernet import SupernetMixin, state_of
from .tree import map_tensors
from .weight_cache import check_budget_mb

FORMAT = "subnetact"
FORMAT_VERSION = 2
_READABLE_VERSIONS = (1, 2)
_DIGEST_KEY = "subnetact.sha256"  # metadata key of the checksum of the tensors and the header (version 2)
# Bounds on the JSON header, checked before (size) and right after (nesting) parsing it: a damaged or hostile file
# must fail with CheckpointError, not a MemoryError or a RecursionError deep in json or in the header's readers. A
# real header (a space, convert options, a few thousand subnets) is far below both.
MAX_HEADER_BYTES = 64 << 20
MAX_HEADER_DEPTH = 32
_MODEL_PREFIX = "model."
_STATS_PREFIX = "stats."
_EXAMPLE_PREFIX = "example."  # tensors of the example inputs convert was given (see ``_encode_example``)


def save(model: nn.Module, path: str | os.PathLike) -> None:
    """Write ``model`` (weights, buffers, registered subnets and their statistics, space, active subnet) to ``path``.

    The ``example_inputs`` the model was converted with (if any) are written too (their tensors and the structure
    around them: tuple / list / dict, numbers, strings, None), so :func:`load` converts a fresh model the same way;
    example inputs holding other objects are not recorded, and ``load`` then asks for ``example_inputs=``.

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
    example = None if state.example_call is None else _encode_example(state.example_call, tensors)
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model_class": f"{type(model)._subnetact_base.__module__}.{type(model)._subnetact_base.__qualname__}",
        "convert_config": state.convert_config.to_dict(),
        "space": state.space.to_dict(),
        "subnets": [cfg.to_dict() for cfg in subnets],
        "active": state.default_config.to_dict(),
        "aliases": aliases,
        "example_inputs": example,
        # None: the default budget (the loading model's own default); else the budget set by the user, in bytes
        "weight_cache_bytes": None if state.weight_cache.default_budget else state.weight_cache.budget_bytes,
    }
    header_json = json.dumps(header)
    path = Path(path)
    tmp = _new_temp_file(path)
    try:
        mode = os.stat(tmp).st_mode & 0o777  # 0666 minus the umask
        save_file(tensors, tmp, metadata={FORMAT: header_json, _DIGEST_KEY: _digest(tensors, header_json)})
        os.chmod(tmp, mode)  # safetensors recreates the file with mode 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _new_temp_file(path: Path) -> str:
    """Create an empty file next to ``path`` for an atomic replace. Unlike ``tempfile.mkstemp`` (mode 0600) it is
    created with mode 0666 minus the umask, so the saved file gets the permissions ``open(path, "w")`` would give."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return str(tmp)
    raise FileExistsError(f"could not create a temporary file next to {str(path)!r}")


def _nesting_depth(doc: Any) -> int:
    """How deeply lists and dicts nest in a parsed JSON document (iterative: any depth, no recursion)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, depth)
            if depth > MAX_HEADER_DEPTH:  # enough to refuse it: do not walk the rest
                return depth
            stack.extend((child, depth + 1) for child in node if isinstance(child, (list, dict)))
    return deepest


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if isinstance(exc, RecursionError) else str(exc)
    return text if len(text) <= 300 else text[:297] + "..."


def load(
    path: str | os.PathLike,
    model_or_factory: nn.Module | Callable[[], nn.Module],
    *,
    example_inputs: Any = None,
    weight_cache_mb: float | str | None = "saved",
) -> nn.Module:
    """Load a file written by :func:`save` into a model and return the model.

    Args:
        path: the file.
        model_or_factory: the model to fill, or a zero-argument callable building it (e.g.
            ``torchvision.models.resnet50``). An unconverted model is converted with the saved convert options.
        example_inputs: what the model's forward takes, for converting an unconverted model (as for
            :func:`~subnetact.convert`). Default: the example inputs recorded in the file (moved to the model's
            device), else the ones convert builds itself. Needed only for a model that was converted with
            ``example_inputs`` and whose file does not record them (saved by subnetact before 0.2, or holding objects
            other than tensors, numbers, strings and None).
        weight_cache_mb: the weight cache's budget in MB (see ``model.set_weight_cache``): ``"saved"`` (default) the
            budget the saved model had (files written before it was saved get the default), None the default, 0
            off.

    Raises:
        CheckpointError: (a ``ValueError``) the file is missing, truncated or corrupted (the sha256 covers the
            tensors and the header; a JSON header over ``MAX_HEADER_BYTES`` (64 MiB) or nested deeper than
            ``MAX_HEADER_DEPTH`` (32) is refused before it is used), was not written by subnetact, or does not match
            the model (space, keys, shapes,
            dtypes, subnets). Every problem with the file raises this, and the model passed in is left as it was
            (a model converted by this call is unconverted again). Also raised when the model needs
            ``example_inputs`` to be converted and neither the call nor the file gives them; the message says so.
        ConfigError: ``example_inputs`` is not a tensor, tuple or dict, or ``weight_cache_mb`` is not ``"saved"``,
            None or a finite number >= 0; raised before the file is read or the model touched.
    """
    from safetensors import SafetensorError, safe_open

    from .convert import unconvert
    from .examples import example_call

    if example_inputs is not None:
        example_call(example_inputs)  # a ConfigError naming the argument, before anything is read
    if not (isinstance(weight_cache_mb, str) and weight_cache_mb == "saved"):
        try:
            check_budget_mb(weight_cache_mb, "load: weight_cache_mb")
        except ConfigError:
            raise ConfigError(
                f'load: weight_cache_mb={weight_cache_mb!r} must be "saved" (the saved budget), None (the default) '
                "or a finite number >= 0 (MB)"
            ) from None
    path = Path(path)
    where = repr(str(path))
    try:
        # One open reads the header (metadata) and every tensor; a truncated file fails here.
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
        header_json = metadata[FORMAT]
        if len(header_json) > MAX_HEADER_BYTES:
            raise CheckpointError(
                f"{where} has a {len(header_json):,}-byte header; a subnetact header is at most {MAX_HEADER_BYTES:,}"
            )
        header = json.loads(header_json)  # a RecursionError past ~1000 levels of nesting (caught below)
    except FileNotFoundError:
        raise CheckpointError(f"{where} does not exist") from None
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CheckpointError(
            f"{where} is not a readable subnetact checkpoint (truncated or corrupted?): {_short_error(exc)}"
        ) from None
    if _nesting_depth(header) > MAX_HEADER_DEPTH:
        raise CheckpointError(
            f"{where} is not a readable subnetact checkpoint: its header nests deeper than {MAX_HEADER_DEPTH} levels"
        )
    if not isinstance(header, dict):
        raise CheckpointError(f"{where} is not a readable subnetact checkpoint: its header is not a JSON object")
    version = header.get("format_version")
    if header.get("format") != FORMAT or version not in _READABLE_VERSIONS:
        raise CheckpointError(
            f"{where} has format {header.get('format')!r} version {version!r}; "
            f"this subnetact reads {FORMAT!r} versions {_READABLE_VERSIONS}"
        )
    if version == 1:  # written before the checksum covered the header
        expected, actual = header.get("sha256"), _digest(tensors)
    else:
        expected, actual = metadata.get(_DIGEST_KEY), _digest(tensors, header_json)
    if actual != expected:
        raise CheckpointError(f"{where} is corrupted: its tensors and header do not match their sha256 checksum")
    try:
        saved = _parse_header(header, tensors)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - a header the checksum accepts but this version cannot use
        raise CheckpointError(f"{where} has a header this subnetact cannot use: {exc!r}") from exc

    model = model_or_factory if isinstance(model_or_factory, nn.Module) else model_or_factory()
    if not isinstance(model, nn.Module):
        raise ArgumentTypeError(f"model_or_factory returned {type(model).__name__}, not an nn.Module")
    converted_here = not isinstance(model, SupernetMixin)
    try:
        if converted_here:
            # Converting a fresh model is the caller's intent; on a mismatch below it is handed back unconverted.
            _convert_fresh(model, saved, example_inputs, where)
        _load_validated(model, tensors, saved, where)
        if weight_cache_mb != "saved":
            model.set_weight_cache(weight_cache_mb)
        elif saved.weight_cache_bytes is None:
            model.set_weight_cache(None)
        else:
            state_of(model).weight_cache.set_budget(saved.weight_cache_bytes)  # exact bytes, no MB round trip
    except BaseException as exc:
        if converted_here and isinstance(model, SupernetMixin):
            unconvert(model)
        if isinstance(exc, CheckpointError) or not isinstance(exc, Exception):
            raise
        raise CheckpointError(f"{where} does not fit the model: {exc!r}") from exc
    return model


def _convert_fresh(model: nn.Module, saved: _SavedHeader, example_inputs: Any, where: str) -> None:
    """Convert ``model`` as the saved one was: its convert options and example inputs (the caller's win)."""
    from .convert import convert
    from .errors import UnsupportedModelError

    if example_inputs is None and saved.example_inputs is not None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        example_inputs = map_tensors(lambda t: t.to(device), saved.example_inputs)
    try:
        convert(model, saved.convert_config, example_inputs=example_inputs)
    except UnsupportedModelError as exc:
        built = f"{type(model).__module__}.{type(model).__qualname__}"
        if saved.model_class is not None and saved.model_class != built:
            # The factory builds another model: asking for example inputs would send the user the wrong way.
            raise CheckpointError(
                f"{where} was saved from a {saved.model_class} but the factory built a {built}, which convert "
                f"refuses ({exc}); pass the factory that builds the saved model"
            ) from exc
        if example_inputs is not None:
            raise
        raise CheckpointError(
            f"{where} records no example inputs and {type(model).__qualname__} could not be converted without them "
            f"({exc}); pass example_inputs= to subnetact.load: what the model's forward takes, as given to "
            "subnetact.convert"
        ) from exc


def _encode_example(call: tuple[tuple, dict], tensors: dict[str, torch.Tensor]) -> Any:
    """The JSON of ``convert``'s example call; its tensors go into ``tensors`` under ``example.<i>``. None if it holds
    an object JSON cannot describe (``load`` then asks for ``example_inputs=``)."""
    added: list[str] = []

    def encode(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            key = f"{_EXAMPLE_PREFIX}{len(added)}"
            tensors[key] = obj.detach().contiguous().cpu()
            added.append(key)
            return {"tensor": key}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return {"value": obj}
        if isinstance(obj, (list, tuple)):
            return {type(obj).__name__: [encode(item) for item in obj]} if type(obj) in (list, tuple) else _no(obj)
        if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
            return {"dict": {k: encode(v) for k, v in obj.items()}}
        return _no(obj)

    args, kwargs = call
    try:
        # convert's ``example_inputs`` is a tuple of positional arguments or a dict of keyword ones.
        return encode(dict(kwargs) if kwargs else tuple(args))
    except _Unrecordable:
        for key in added:
            del tensors[key]
        return None


class _Unrecordable(Exception):
    pass


def _no(obj: Any) -> Any:
    raise _Unrecordable(type(obj).__name__)


def _decode_example(encoded: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if not isinstance(encoded, dict) or len(encoded) != 1:
        raise CheckpointError(f"example_inputs has an entry {encoded!r} this subnetact cannot read")
    ((kind, value),) = encoded.items()
    if kind == "tensor" and value in tensors and str(value).startswith(_EXAMPLE_PREFIX):
        return tensors[value]
    if kind == "value" and (value is None or isinstance(value, (bool, int, float, str))):
        return value
    if kind in ("list", "tuple") and isinstance(value, list):
        items = [_decode_example(item, tensors) for item in value]
        return items if kind == "list" else tuple(items)
    if kind == "dict" and isinstance(value, dict):
        return {k: _decode_example(v, tensors) for k, v in value.items()}
    raise CheckpointError(f"example_inputs has an entry {encoded!r} this subnetact cannot read")


@dataclass(frozen=True)
class _SavedHeader:
    """A checkpoint's header, parsed and type-checked before the model is touched."""

    convert_config: Any
    space: Space
    subnets: list[SubnetConfig]
    active: SubnetConfig
    aliases: dict[str, str]
    example_inputs: Any  # convert's example_inputs (a tuple or a dict), None if not recorded
    weight_cache_bytes: int | None
    model_class: str | None = None  # "module.QualName" of the saved model's class


def _parse_header(header: dict, tensors: dict[str, torch.Tensor]) -> _SavedHeader:
    from .plan import ConvertConfig

    options = header["convert_config"]
    if not isinstance(options, dict):
        raise CheckpointError(f"convert_config must be a JSON object, got {options!r}")
    aliases = header["aliases"]
    if not isinstance(aliases, dict) or not all(
        isinstance(k, str) and k.startswith(_MODEL_PREFIX) and v in tensors for k, v in aliases.items()
    ):
        raise CheckpointError(f"aliases must map model keys to stored tensors, got {aliases!r}")
    subnets = header["subnets"]
    if not isinstance(subnets, list):
        raise CheckpointError(f"subnets must be a JSON list, got {subnets!r}")
    cache_bytes = header.get("weight_cache_bytes")  # absent in files written before the weight cache
    if cache_bytes is not None and (not is_int(cache_bytes) or cache_bytes < 0):
        raise CheckpointError(f"weight_cache_bytes must be null or an integer >= 0, got {cache_bytes!r}")
    return _SavedHeader(
        convert_config=ConvertConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}),
        space=Space.from_dict(header["space"]),
        subnets=[SubnetConfig.from_dict(c) for c in subnets],
        active=SubnetConfig.from_dict(header["active"]),
        aliases=dict(aliases),
        # Absent from files written before example inputs were recorded.
        example_inputs=None
        if header.get("example_inputs") is None
        else _decode_example(header["example_inputs"], tensors),
        weight_cache_bytes=cache_bytes,
        model_class=header.get("model_class") if isinstance(header.get("model_class"), str) else None,
    )


def _load_validated(model: nn.Module, tensors: dict, saved: _SavedHeader, where: str) -> None:
    state = state_of(model)
    space = saved.space
    if space != state.space:
        raise CheckpointError(
            f"{where} was saved from a model with a different space:\n{space}\nthe model has:\n{state.space}"
        )
    tensors = dict(tensors)
    for alias, target in saved.aliases.items():
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
    for i, cfg in enumerate(saved.subnets):
        cfg = state.space.validate(cfg)
        buffer = tensors.get(f"{_STATS_PREFIX}{i}")
        numel = 2 * sum(k for _, k in state.stats_layout(cfg))
        if buffer is None or buffer.numel() != numel:
            raise CheckpointError(f"{where}: statistics of subnet {cfg.id} are missing or have the wrong size")
        stats[cfg] = buffer
    active = state.space.validate(saved.active)

    # Everything checked: commit.
    with torch.no_grad():
        for key, ref in expected.items():
            ref.copy_(model_tensors[key])
    device = next((t.device for t in expected.values()), torch.device("cpu"))
    dtype = next((m.running_mean.dtype for m in state.ops if getattr(m, "running_mean", None) is not None), None)
    state.stats = {cfg: t.to(device=device, dtype=dtype or t.dtype) for cfg, t in stats.items()}
    state.invalidate(default=active)


def _digest(tensors: dict[str, torch.Tensor], header_json: str | None = None) -> str:
    """sha256 of every tensor (key, dtype, shape, bytes) and, from format version 2 on, of the header's JSON text."""
    h = hashlib.sha256()
    if header_json is not None:
        h.update(header_json.encode())
    for key in sorted(tensors):
        t = tensors[key].contiguous()
        h.update(key.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
