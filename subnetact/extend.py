"""What an author of support for a new architecture needs, in one public module.

- **Block rules** (:func:`register_block_rule`): the elastic channels and skippability of one block class; they win
  over the trace for the blocks they know.
- **Model adapters** (:func:`register_model_adapter`): a whole-model analysis returning a :class:`ConversionPlan`
  (stages, space dimensions, channel groups, the layers each slices), used instead of the default analysis.
- **Export hooks** (:func:`register_export_hook`): fix up an exported model (e.g. give it a smaller config).
- **Operators** (:class:`Operator`): the interface of modules whose forward reads the active plan; a plan's
  ``custom`` entries build user-defined ones.
- **Norm-with-activation classes** (:data:`NORM_ACT_CLASSES`): BatchNorm2d subclasses that are BatchNorm2d followed
  by ``drop`` / ``act`` modules, which :class:`SubnetNorm` can stand in for; :data:`LAYER_NORM_CLASSES`: LayerNorm
  subclasses computing ``F.layer_norm``, which :class:`SubnetLayerNorm` can stand in for.
- **Packed attentions** (:func:`register_packed_attention`): attention classes with one fused q/k/v projection whose
  heads the traced analysis slices (timm's ViT attention is built in; ``nn.MultiheadAttention`` always).

Example::

    from subnetact.extend import ConversionPlan, StagePlan, register_model_adapter

    @register_model_adapter("mylib.models.MyNet")
    def my_net(model, config, filter_fn) -> ConversionPlan:
        ...
"""

from .attention import (
    NarrowMultiheadAttention,
    PackedAttention,
    PackedSliceLinear,
    SubnetMultiheadAttention,
    register_packed_attention,
)
from .convert import ConversionPlan, ConvertConfig, StagePlan, active_size, register_model_adapter
from .export import register_export_hook
from .head_count import HeadCount
from .layer_select import EVERY_OTHER, PREFIX, LayerSelect, LayerSelectList
from .operator import Operator
from .rules import BlockSpec, ChannelSpec, register_block_rule, unregister_block_rule
from .slimmable_norm import LAYER_NORM_CLASSES, SubnetGroupNorm, SubnetLayerNorm
from .space import Entry, Space
from .state import ActuationState, ChannelGroup, Plan
from .subnet_norm import SubnetNorm
from .supernet import state_of
from .trace import NORM_ACT_CLASSES
from .weight_slice import WeightSlice, WeightSliceConv2d, WeightSliceLinear

__all__ = [
    "EVERY_OTHER",
    "LAYER_NORM_CLASSES",
    "NORM_ACT_CLASSES",
    "PREFIX",
    "ActuationState",
    "BlockSpec",
    "ChannelGroup",
    "ChannelSpec",
    "ConversionPlan",
    "ConvertConfig",
    "Entry",
    "HeadCount",
    "LayerSelect",
    "LayerSelectList",
    "NarrowMultiheadAttention",
    "Operator",
    "PackedAttention",
    "PackedSliceLinear",
    "Plan",
    "Space",
    "StagePlan",
    "SubnetGroupNorm",
    "SubnetLayerNorm",
    "SubnetMultiheadAttention",
    "SubnetNorm",
    "WeightSlice",
    "WeightSliceConv2d",
    "WeightSliceLinear",
    "active_size",
    "register_block_rule",
    "register_export_hook",
    "register_model_adapter",
    "register_packed_attention",
    "state_of",
    "unregister_block_rule",
]
