"""Hugging Face ``transformers`` encoders as DynaBERT-style supernets: BERT, RoBERTa and ViT (issue 5).

Importing this package registers the model adapters by class name; it never imports ``transformers``.

    >>> model = subnetact.convert(transformers.BertForSequenceClassification(config))
    >>> subnetact.reorder(model, batches)           # importance order, so prefixes are the important heads/neurons
    >>> model.actuate(depth=6, width=0.5)           # every other layer, half the heads and FFN neurons
    >>> model.actuate(heads=0.25, ffn=[1.0] * 12)   # heads and FFN separately, per layer
    >>> dense = model.export()                      # a BertForSequenceClassification with the smaller config

See ``docs/transformers.md``.
"""

from __future__ import annotations

from .adapter import active_heads, active_neurons
from .families import BERT, ROBERTA, VIT, TransformerFamily, register_family
from .reorder import ReorderResult, reorder

_BERT = "transformers.models.bert.modeling_bert."
_ROBERTA = "transformers.models.roberta.modeling_roberta."
_VIT = "transformers.models.vit.modeling_vit."

register_family(BERT, [_BERT + "BertModel", _BERT + "BertForSequenceClassification"])
register_family(ROBERTA, [_ROBERTA + "RobertaModel", _ROBERTA + "RobertaForSequenceClassification"])
register_family(VIT, [_VIT + "ViTModel", _VIT + "ViTForImageClassification"])

__all__ = [
    "BERT",
    "ROBERTA",
    "VIT",
    "ReorderResult",
    "TransformerFamily",
    "active_heads",
    "active_neurons",
    "register_family",
    "reorder",
]
