"""once-for-all subnet dicts <-> :class:`~subnetact.SubnetConfig`, for the space of a converted OFA network.

OFA's dicts cannot be read without knowing the network, so both directions take the converted model's space:

=================  ====================================================  ===========================================
OFA key            ``OFAResNets``                                        ``OFAMobileNetV3``, ``OFAProxylessNASNets``
=================  ====================================================  ===========================================
``d``              5 values in ``depth_list``: ``d[0]`` is the stem      5 *absolute* depths in ``depth_list`` (6 for
                   flag (stem block runs iff ``d[0] == max``), ``d[1:]`` ``OFAProxylessNASNets``, whose one-block
                   the blocks *beyond* ``(2, 2, 4, 2)`` per stage        last stage runs ``min(1, d)`` blocks)
``e``              18 expand ratios, one per block, skipped ones too     20 expand ratios (``blocks[1:]``; 21 for
                                                                         ``OFAProxylessNASNets``)
``w`` / ``ks``     ``w``: 6 *indices* into ``width_mult_list``           ``ks``: 20 kernel sizes (21)
=================  ====================================================  ===========================================

Ours uses ``depth`` (absolute blocks; the stem entry is 0/1), ``expand``, and ``width`` (multipliers, not indices)
or ``kernel``. A scalar broadcasts to every entry, as OFA's ``val2list`` does. ``from_ofa(to_ofa(cfg)) == cfg``
always; ``to_ofa(from_ofa(d)) == d`` for every dict OFA's ``sample_active_subnet`` returns (its stem flag is
``min`` or ``max``; any other non-max value means "skip" too and comes back as ``min(depth_list)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..checks import is_real
from ..config import SubnetConfig
from ..errors import InvalidSubnetError, NotConvertedError
from ..space import Space
from .resnet import BASE_DEPTH, STEM_DEPTH_PATH

# Extra keys OFA's NAS tools add to subnet dicts; they describe the input, not the network, and are ignored.
_IGNORED = ("image_size", "r", "wid")


def _space_of(space: Any) -> Space:
    if isinstance(space, Space):
        return space
    inner = getattr(space, "space", None)
    if isinstance(inner, Space):
        return inner
    raise NotConvertedError(f"space={space!r} must be a subnetact.Space or a converted model (with .space)")


def family(space: Space) -> str:
    """``"resnet"`` or ``"mbv3"`` (``OFAMobileNetV3`` or ``OFAProxylessNASNets``, which share the dict format):
    which OFA network ``space`` was converted from."""
    dims = set(space.dims)
    depth = space.entries("depth") if "depth" in dims else ()
    if dims == {"depth", "expand", "width"} and depth and depth[0].name == STEM_DEPTH_PATH:
        return "resnet"
    if dims == {"depth", "expand", "kernel"}:
        return "mbv3"
    raise InvalidSubnetError(
        f"this space (dimensions {sorted(dims)}) is not the space of a converted once-for-all OFAResNets or "
        "OFAMobileNetV3; convert the OFA network with subnetact.convert and pass model.space"
    )


def _values(arch: Mapping, key: str, n: int, net: str) -> list:
    if key not in arch:
        raise InvalidSubnetError(
            f"OFA {net} config {dict(arch)!r} has no {key!r}; it needs 'd', 'e' and "
            f"{'w' if net == 'OFAResNets' else 'ks'}"
        )
    value = arch[key]
    if is_real(value):
        return [value] * n
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidSubnetError(f"{key}={value!r} must be a number or a list of {n} numbers")
    if len(value) != n:
        raise InvalidSubnetError(f"{key}={list(value)!r} has {len(value)} values; OFA's {net} here needs {n}")
    for i, v in enumerate(value):
        if not is_real(v):
            raise InvalidSubnetError(f"{key}[{i}]={v!r} must be a number")
    return list(value)


def _check_keys(arch: Any, allowed: tuple[str, ...], net: str, other: str) -> None:
    if not isinstance(arch, Mapping):
        raise InvalidSubnetError(f"an OFA config must be a dict like {{'d': [...], 'e': [...], ...}}, got {arch!r}")
    unknown = sorted(set(arch) - set(allowed) - set(_IGNORED))
    if unknown:
        hint = f" ({unknown[0]!r} belongs to {other} configs)" if set(unknown) & {"ks", "w"} else ""
        raise InvalidSubnetError(f"OFA {net} config has unknown key(s) {unknown}{hint}; allowed: {list(allowed)}")


def _pick(key: str, i: int, v: Any, allowed: Sequence) -> Any:
    for a in allowed:
        if v == a:
            return a
    raise InvalidSubnetError(f"{key}[{i}]={v!r} is not allowed: allowed values are {tuple(allowed)}")


def from_ofa(arch: Mapping[str, Any], space: Any) -> SubnetConfig:
    """The :class:`SubnetConfig` of an OFA subnet dict (see the module docstring).

    Args:
        arch: OFA's dict, ``{"d": [...], "e": [...], "w": [...]}`` (ResNet) or ``{"ks", "e", "d"}`` (MobileNetV3).
        space: the converted model's :class:`~subnetact.Space`, or the model itself.

    Raises:
        InvalidSubnetError: naming the key, the index, the value and what is allowed.

    Example::

        >>> cfg = subnetact.SubnetConfig.from_ofa({"d": [2, 2, 2, 2, 2], "e": 0.35, "w": 2}, model)
    """
    space = _space_of(space)
    if family(space) == "mbv3":
        _check_keys(arch, ("d", "e", "ks"), "OFAMobileNetV3", "OFAResNets")
        n_d, n_b = len(space.entries("depth")), len(space.entries("expand"))
        # OFA runs min(len(stage), d) blocks: ProxylessNAS's one-block last stage takes any d of depth_list (its
        # sampler sends 1); the full stages' choices are depth_list itself.
        depth_list = set(space.entries("depth")[0].choices)
        d = [
            min(_pick("d", i, v, tuple(sorted(depth_list | set(e.choices)))), max(e.choices))
            for i, (v, e) in enumerate(zip(_values(arch, "d", n_d, "OFAMobileNetV3"), space.entries("depth")))
        ]
        e = [
            _pick("e", i, v, x.choices)
            for i, (v, x) in enumerate(zip(_values(arch, "e", n_b, "OFAMobileNetV3"), space.entries("expand")))
        ]
        ks = [
            _pick("ks", i, v, x.choices)
            for i, (v, x) in enumerate(zip(_values(arch, "ks", n_b, "OFAMobileNetV3"), space.entries("kernel")))
        ]
        return space.validate(SubnetConfig(depth=d, expand=e, kernel=ks))

    _check_keys(arch, ("d", "e", "w"), "OFAResNets", "OFAMobileNetV3")
    depth_list = _depth_list(space)
    d = _values(arch, "d", 1 + len(BASE_DEPTH), "OFAResNets")
    depth = [1 if _pick("d", 0, d[0], depth_list) == max(depth_list) else 0]
    depth += [base + _pick("d", s + 1, v, depth_list) for s, (base, v) in enumerate(zip(BASE_DEPTH, d[1:]))]
    expand_entries = space.entries("expand")
    e = [
        _pick("e", i, v, x.choices)
        for i, (v, x) in enumerate(zip(_values(arch, "e", len(expand_entries), "OFAResNets"), expand_entries))
    ]
    width_entries = space.entries("width")
    w = _values(arch, "w", len(width_entries), "OFAResNets")
    width = []
    for i, (v, entry) in enumerate(zip(w, width_entries)):
        if not isinstance(v, int) or not 0 <= v < len(entry.choices):
            raise InvalidSubnetError(
                f"w[{i}]={v!r} must be an index into width_mult_list={list(entry.choices)}: an int in "
                f"0..{len(entry.choices) - 1} (OFA's w holds indices, not multipliers)"
            )
        width.append(entry.choices[v])
    return space.validate(SubnetConfig(depth=depth, expand=e, width=width))


def to_ofa(cfg: SubnetConfig, space: Any) -> dict[str, list]:
    """OFA's dict for ``cfg`` (the inverse of :func:`from_ofa`): pass it to ``set_active_subnet(**d)``.

    Raises:
        InvalidSubnetError: ``cfg`` is not in ``space``.
    """
    space = _space_of(space)
    cfg = space.validate(cfg if isinstance(cfg, SubnetConfig) else SubnetConfig.from_dict(cfg))
    if family(space) == "mbv3":
        return {"ks": list(cfg["kernel"]), "e": list(cfg["expand"]), "d": list(cfg["depth"])}
    depth_list = _depth_list(space)
    stem, *stages = cfg["depth"]
    d = [max(depth_list) if stem == 1 else min(depth_list)] + [v - base for v, base in zip(stages, BASE_DEPTH)]
    w = [entry.choices.index(v) for v, entry in zip(cfg["width"], space.entries("width"))]
    return {"d": d, "e": list(cfg["expand"]), "w": w}


def _depth_list(space: Space) -> list[int]:
    lists = {tuple(c - base for c in e.choices) for e, base in zip(space.entries("depth")[1:], BASE_DEPTH)}
    if len(lists) != 1:
        raise InvalidSubnetError(f"the stages of this space imply different OFA depth lists {sorted(lists)}")
    return list(lists.pop())
