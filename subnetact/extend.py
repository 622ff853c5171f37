"""What an author of support for a new architecture needs, in one public module.

- **Block rules** (:func:`register_block_rule`): the elastic channels and skippability of one block class; they win
  over the trace for the blocks they know.
- **Model adapters** (:func:`register_model_adapter`): a whole-model analysis returning a :class:`ConversionPlan`
  (stages, space dimensions, channel groups, the layers each slices), used instead of the default analysis.
- **Export hooks** (:func:`register_export_hook`): fix up an exported model (e.g. give it a smaller config).
- **Operators** (:class:`Operator`): the interface of modules whose forward reads the active plan.
- **Operator kinds** (:func:`register_operator_kind`): a plan names, per module path, an :class:`OperatorEntry`
  (kind, channel groups, options); the handler registered for the kind builds the operator. A new operator kind is
  one handler and one registration; ``convert`` does not change. A plan's ``custom`` entries are one-off factories.
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

from .attention import PackedAttention, PackedSliceLinear, register_packed_attention
from .export import register_export_hook
from .handlers import OperatorEntry, OperatorHandler, register_operator_kind, registered_kinds
from .head_count import HeadCount
from .layer_select import EVERY_OTHER, PREFIX, LayerSelect, LayerSelectList
from .mha import NarrowMultiheadAttention, SubnetMultiheadAttention
from .operator import Operator
from .plan import ConversionPlan, ConvertConfig, StagePlan, register_model_adapter
from .rules import BlockSpec, ChannelSpec, register_block_rule, unregister_block_rule
from .slimmable_norm import LAYER_NORM_CLASSES, SubnetGroupNorm, SubnetLayerNorm
from .space import Entry, Space
from .state import ActuationState, ChannelGroup, Plan, active_size, width_sizes
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
    "OperatorEntry",
    "OperatorHandler",
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
    "register_operator_kind",
    "register_packed_attention",
    "registered_kinds",
    "state_of",
    "unregister_block_rule",
    "width_sizes",
]
