"""subnetact: serve weight-shared supernets by actuating any subnet in place (SubNetAct, SuperServe NSDI'25).

    >>> import subnetact, torchvision
    >>> model = subnetact.convert(torchvision.models.resnet50())
    >>> model.actuate(depth=[2, 3, 4, 2], width=0.5)
    >>> dense = model.export()

Importing this package never initialises CUDA and never imports torchvision or transformers.
"""

from . import (
    builtins,  # noqa: F401  (registers the built-in rules and adapters by class name; imports no optional library)
    extend,  # the extension API: rules, adapters, plans, operators
    hf,
    ofa,
    search,  # Pareto search (torch only)
    train,  # supernet training: sandwich rule + in-place distillation
)
from .calibrate import calibrate
from .config import SubnetConfig
from .convert import ConvertConfig, convert, unconvert
from .errors import (
    CheckpointError,
    ConfigError,
    InvalidSubnetError,
    NotConvertedError,
    SubnetActError,
    UncalibratedSubnetWarning,
    UnsupportedModelError,
)
from .export import export
from .hf import reorder
from .importance import reorder_channels
from .io import load, save
from .layer_select import LayerSelect, LayerSelectList, kept_layers
from .profiler import profile  # imports scheduling lazily, inside the function
from .rules import BlockSpec, ChannelSpec, register_block_rule
from .space import Entry, Space
from .subnet_norm import SubnetNorm
from .supernet import SupernetMixin
from .weight_cache import WeightCacheInfo
from .weight_slice import WeightSlice, WeightSliceConv2d, WeightSliceLinear


def _version() -> str:
    # One source of truth: pyproject.toml, read back from the installed package's metadata.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("subnetact")
    except PackageNotFoundError:  # imported from a source tree that was never installed (PYTHONPATH=.)
        return "0+unknown"


__version__ = _version()

__all__ = [
    "BlockSpec",
    "ChannelSpec",
    "CheckpointError",
    "ConfigError",
    "ConvertConfig",
    "Entry",
    "InvalidSubnetError",
    "LayerSelect",
    "LayerSelectList",
    "NotConvertedError",
    "Space",
    "SubnetActError",
    "SubnetConfig",
    "SubnetNorm",
    "SupernetMixin",
    "UncalibratedSubnetWarning",
    "UnsupportedModelError",
    "WeightCacheInfo",
    "WeightSlice",
    "WeightSliceConv2d",
    "WeightSliceLinear",
    "__version__",
    "calibrate",
    "convert",
    "export",
    "extend",
    "hf",
    "kept_layers",
    "load",
    "ofa",
    "profile",
    "register_block_rule",
    "reorder",
    "reorder_channels",
    "save",
    "search",
    "train",
    "unconvert",
]
