"""Hugging Face ``transformers`` encoders as DynaBERT-style supernets: BERT, RoBERTa, ELECTRA, XLM-RoBERTa,
DistilBERT, DeBERTa-v2, ViT, DeiT, CLIP (text and vision), Wav2Vec2, Whisper's encoder, and MPNet and T5's encoder
(depth and FFN only: a per-head relative position bias fixes their heads) built in (issues 5, 11 and 21), and any model
class whose encoder layers have one of their layouts (CamemBERT, ``BertForMaskedLM``, HuBERT, ...: found by layout,
verified, then registered); other encoders through :func:`register_family`.

Importing this package registers the model adapters by class name; it never imports ``transformers``.

    >>> model = subnetact.convert(transformers.BertForSequenceClassification(config))
    >>> subnetact.reorder(model, batches)           # importance order, so prefixes are the important heads/neurons
    >>> model.actuate(depth=6, width=0.5)           # every other layer, half the heads and FFN neurons
    >>> model.actuate(heads=0.25, ffn=[1.0] * 12)   # heads and FFN separately, per layer
    >>> dense = model.export()                      # a BertForSequenceClassification with the smaller config

See ``docs/transformers.md``.
"""

from __future__ import annotations

from . import unregistered  # noqa: F401  (registers the adapter for Hugging Face classes of no family)
from .adapter import active_heads, active_neurons, register_family
from .decode_engine import ElasticDecodeEngine
from .decoder_reorder import DecoderReorderResult, reorder_decoder
from .decoders import GEMMA, GEMMA2, GPT2, LLAMA, MISTRAL, OPT, PHI3, QWEN2, QWEN3, DecoderFamily, register_decoder
from .families import (
    BERT,
    CLIP,
    DEBERTA_V2,
    DEIT,
    DISTILBERT,
    ELECTRA,
    MPNET,
    ROBERTA,
    T5,
    T5_GATED,
    VIT,
    WAV2VEC2,
    WHISPER,
    XLM_ROBERTA,
    TransformerFamily,
)
from .reorder import ReorderResult, reorder

_MODELS = "transformers.models."
# (family, module under transformers.models, model-class prefix, head classes registered besides the base model)
_BUILTIN = (
    (BERT, "bert.modeling_bert", "Bert", ("ForSequenceClassification",)),
    (ROBERTA, "roberta.modeling_roberta", "Roberta", ("ForSequenceClassification",)),
    (ELECTRA, "electra.modeling_electra", "Electra", ("ForSequenceClassification",)),
    (XLM_ROBERTA, "xlm_roberta.modeling_xlm_roberta", "XLMRoberta", ("ForSequenceClassification",)),
    (DISTILBERT, "distilbert.modeling_distilbert", "DistilBert", ("ForSequenceClassification",)),
    (DEBERTA_V2, "deberta_v2.modeling_deberta_v2", "DebertaV2", ("ForSequenceClassification",)),
    (VIT, "vit.modeling_vit", "ViT", ("ForImageClassification",)),
    (DEIT, "deit.modeling_deit", "DeiT", ("ForImageClassification", "ForImageClassificationWithTeacher")),
    (WAV2VEC2, "wav2vec2.modeling_wav2vec2", "Wav2Vec2", ("ForSequenceClassification", "ForCTC")),
    (MPNET, "mpnet.modeling_mpnet", "MPNet", ("ForSequenceClassification",)),
    # Encoder-only classes (T5Model and WhisperModel hold a decoder too: two layer lists, refused).
    (T5, "t5.modeling_t5", "T5", ("EncoderModel",)),
    (WHISPER, "whisper.modeling_whisper", "Whisper", ("Encoder", "ForAudioClassification")),
)
for _family, _module, _prefix, _heads in _BUILTIN:
    _suffixes = _heads if _family in (T5, WHISPER) else ("Model", *_heads)
    register_family(_family, [f"{_MODELS}{_module}.{_prefix}{suffix}" for suffix in _suffixes])
# CLIP's towers one at a time (CLIPModel holds two layer lists, one per tower: refused, naming both).
register_family(
    CLIP,
    [
        f"{_MODELS}clip.modeling_clip.CLIP{tower}{suffix}"
        for tower in ("Text", "Vision")
        for suffix in ("Model", "ModelWithProjection")
    ],
)

__all__ = [
    "BERT",
    "CLIP",
    "DEBERTA_V2",
    "DEIT",
    "DISTILBERT",
    "ELECTRA",
    "GEMMA",
    "GEMMA2",
    "GPT2",
    "LLAMA",
    "MISTRAL",
    "MPNET",
    "OPT",
    "PHI3",
    "QWEN2",
    "QWEN3",
    "ROBERTA",
    "T5",
    "T5_GATED",
    "VIT",
    "WAV2VEC2",
    "WHISPER",
    "XLM_ROBERTA",
    "DecoderFamily",
    "DecoderReorderResult",
    "ElasticDecodeEngine",
    "ReorderResult",
    "TransformerFamily",
    "active_heads",
    "active_neurons",
    "register_decoder",
    "register_family",
    "reorder",
    "reorder_decoder",
]
