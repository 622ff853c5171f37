"""What ``convert`` tells a Hugging Face model whose class no family is registered for (issue 11).

Without this, such a model (``BertForMaskedLM``, a ``GPT2Model``) reaches the generic block-rule analysis and is
told to write a ``register_block_rule``, which cannot describe a transformer. This adapter is registered for
``transformers.modeling_utils.PreTrainedModel`` by name, so it is only found for Hugging Face classes that no
family claims (a registered class is found first along the MRO). A model with an encoder-like layer list is refused
with the :func:`subnetact.hf.register_family` call that would convert it; any other model (a convolutional one)
goes on to convert's default analysis.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .._registry import qualified_name
from ..errors import UnsupportedModelError
from ..plan import ConversionPlan, ConvertConfig, register_model_adapter
from .adapter import analyse, register_family
from .families import TransformerFamily, family_by_layout, family_of_layer_class, layout_mismatches

PRETRAINED_MODEL = "transformers.modeling_utils.PreTrainedModel"


def _public_name(family: TransformerFamily) -> str:
    """``subnetact.hf.BERT`` for a built-in family, else the family's repr."""
    from . import families

    for name in dir(families):
        if name.isupper() and getattr(families, name) is family:
            return f"subnetact.hf.{name}"
    return f"<your TransformerFamily {family.name!r}>"


def _layer_lists(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """``nn.ModuleList`` of one class whose members hold an attention submodule and linear layers."""
    found = []
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        classes = {type(child) for child in module}
        first = module[0]
        if len(classes) == 1 and any(
            ("attention" in name.lower() or "attn" in name.lower()) for name, _ in first.named_modules()
        ):
            found.append((path, module))
    return found


def _hint(model: nn.Module) -> str:
    qualname = qualified_name(type(model))
    for path, layers in _layer_lists(model):
        family = family_of_layer_class(type(layers[0]).__name__)
        if family is not None:
            return (
                f"{type(model).__qualname__} is a Hugging Face model of no registered class; its layers {path!r} "
                f"({type(layers[0]).__name__}) are those of the family {_public_name(family)}: call "
                f"subnetact.hf.register_family({_public_name(family)}, [{qualname!r}]) before convert"
            )
    lists = _layer_lists(model)
    why = ""
    if len(lists) == 1:
        path, layers = lists[0]
        why = (
            f" Its layers {path!r} ({type(layers[0]).__name__}) have the layout of no built-in family: "
            + "; ".join(f"{name}: {reason}" for name, reason in layout_mismatches(path, layers))
            + "."
        )
    elif len(lists) > 1:
        why = f" It has {len(lists)} lists of attention layers ({', '.join(repr(p) for p, _ in lists)}), not one."
    return (
        f"{type(model).__qualname__} is a Hugging Face model of no registered class.{why} Describe its encoder layer "
        f"with a subnetact.hf.TransformerFamily and call subnetact.hf.register_family(family, [{qualname!r}]) "
        "(see docs/transformers.md); subnetact.register_block_rule does not apply to transformers"
    )


def unregistered_adapter(
    model: nn.Module, config: ConvertConfig, filter_fn: Callable[[nn.Module, str], bool] | None
) -> ConversionPlan | None:
    """Model adapter for Hugging Face classes without a family (see the module docstring).

    A model whose one encoder-like layer list has the layout of a registered or built-in family
    (:func:`~subnetact.hf.families.family_by_layout`: CamemBERT, ``BertForMaskedLM``, CLIP, HuBERT) is converted
    with that family, which is then registered for its class (so ``export`` and ``reorder`` know it); the family is
    verified on the model first, and a model it does not describe is refused naming what blocks it. A model with
    layer lists no family fits is refused with the :func:`subnetact.hf.register_family` call to make; any other
    model (a convolutional one) returns None and goes on to convert's default (traced, verified) analysis.
    """
    lists = _layer_lists(model)
    if not lists:
        return None
    if len(lists) == 1:
        family = family_by_layout(model, *lists[0])
        if family is not None:
            plan = analyse(model, config, filter_fn, family)
            register_family(family, [qualified_name(type(model))])
            return plan
    raise UnsupportedModelError(_hint(model))


register_model_adapter(PRETRAINED_MODEL)(unregistered_adapter)
