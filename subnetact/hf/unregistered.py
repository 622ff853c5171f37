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

import torch
from torch import nn

from .._registry import qualified_name
from ..errors import UnsupportedModelError
from ..plan import ConversionPlan, ConvertConfig, register_model_adapter
from .adapter import analyse, register_family
from .families import TransformerFamily, family_by_layout, family_of_layer_class, layout_mismatches
from .verify import default_example_inputs

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
    lists = _layer_lists(model)
    if len(lists) > 1:
        blocker = _several_lists(model, lists)
        if blocker is not None:
            return blocker
    for path, layers in lists:
        family = family_of_layer_class(type(layers[0]).__name__)
        if family is not None:
            return (
                f"{type(model).__qualname__} is a Hugging Face model of no registered class; its layers {path!r} "
                f"({type(layers[0]).__name__}) are those of the family {_public_name(family)}: call "
                f"subnetact.hf.register_family({_public_name(family)}, [{qualname!r}]) before convert"
            )
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


def _several_lists(model: nn.Module, lists: list[tuple[str, nn.ModuleList]]) -> str | None:
    """Why a model with several attention layer lists cannot be converted, naming the operation that blocks it:
    nested lists whose inner layers run several times per forward (ALBERT's cross-layer parameter sharing), nested
    lists run once (hierarchical stages: Swin), or separate towers (an encoder and a decoder). None: no such
    structure was recognised (the caller gives the generic advice)."""
    name = type(model).__qualname__
    paths = [path for path, _ in lists]
    inner = [(path, layers) for path, layers in lists if any(path.startswith(f"{other}.") for other in paths)]
    if not inner:  # side by side: towers (encoder and decoder, text and vision)
        towers = ", ".join(f"{path!r} ({type(layers[0]).__name__})" for path, layers in lists)
        return (
            f"{name} holds {len(lists)} separate lists of attention layers ({towers}): subnetact converts a model "
            "with one list of encoder layers (one depth stage). Convert the encoder on its own (an encoder-only "
            "class such as T5EncoderModel, WhisperEncoder or CLIPTextModel, or the submodule holding one list)"
        )
    runs = _calls_per_layer(model, inner)
    shared = [(path, layer, n) for path, layer, n in runs if n > 1]
    if shared:
        path, layer, n = shared[0]
        config = getattr(model, "config", None)
        return (
            f"{name} shares layers across depth (cross-layer parameter sharing): {path} ({type(layer).__name__}) "
            f"runs {n} times in one forward (config.num_hidden_layers="
            f"{getattr(config, 'num_hidden_layers', '?')} applications of "
            f"{sum(len(layers) for _, layers in inner)} layer module(s)), so one set of weights serves several "
            "depths and neither a depth nor a width per position can be actuated. Refused: subnetact needs one "
            "module per layer position"
        )
    outer = [path for path in paths if any(other.startswith(f"{path}.") for other in paths)]
    tables = sorted(
        {
            f"{param_name} {tuple(param.shape)}"
            for _, layers in inner[:1]
            for param_name, param in layers[0].named_parameters()
            if "relative" in param_name
        }
    )
    per_head = (
        f"; and each layer's attention adds a relative position bias table ({', '.join(tables)}; one column per "
        "head) to its scores, so heads could not be sliced without slicing that table"
        if tables
        else ""
    )
    widths = [_input_width(layers[0]) for _, layers in inner]
    changing = (
        f" and the hidden size changing between stages ({' -> '.join(map(str, widths))}: patch merging)"
        if len(set(widths)) > 1
        else ""
    )
    return (
        f"{name} is hierarchical: {outer[0]!r} holds {len(inner)} stages, each with its own list of attention "
        f"layers ({', '.join(repr(path) for path, _ in inner)}){changing}; subnetact's transformer families "
        f"describe one list of layers of one width, so depth and width per stage are not supported{per_head}. "
        "Refused"
    )


def _input_width(layer: nn.Module) -> int | None:
    """The input features of the first linear layer in ``layer`` (its hidden size), or None."""
    return next((m.in_features for m in layer.modules() if isinstance(m, nn.Linear)), None)


def _calls_per_layer(model: nn.Module, lists: list[tuple[str, nn.ModuleList]]) -> list[tuple[str, nn.Module, int]]:
    """``(path, layer, calls)`` of every layer of ``lists`` in one tiny forward (the model is left as it was); empty
    if no tiny input can be built or the forward fails (nothing is claimed then)."""
    counts: dict[int, int] = {}
    entries = [(f"{path}.{i}", layer) for path, layers in lists for i, layer in enumerate(layers)]

    def count(module: nn.Module, args: tuple, out: object) -> None:
        counts[id(module)] = counts.get(id(module), 0) + 1

    modes = {m: m.training for m in model.modules()}
    handles = [layer.register_forward_hook(count) for _, layer in entries]
    try:
        model.eval()
        with torch.no_grad():
            model(**default_example_inputs(model))
    except Exception:  # noqa: BLE001 (a diagnosis only: without a forward the structure alone is reported)
        return []
    finally:
        for handle in handles:
            handle.remove()
        for m, training in modes.items():
            m.training = training
    return [(path, layer, counts.get(id(layer), 0)) for path, layer in entries]


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
