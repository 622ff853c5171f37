"""Built-in support for timm's vision-transformer attention (ViT, DeiT, and every timm model built on
timm's ``Attention``): its fused ``qkv`` projection is sliced by whole heads.

Registered by qualified name, so importing subnetact does not import timm.
"""

from __future__ import annotations

from ..attention import PackedAttention, register_packed_attention

# ``gate`` (gated attention) produces one channel per attention-output channel; ``norm`` (scale_norm=True) is a
# LayerNorm over the attention output, which normalises over the active heads' channels (nn.Identity otherwise).
_SPEC = PackedAttention(head_producers=("gate",), head_norms=("norm",))
# timm >= 1.0.20 defines it in timm.layers.attention (vision_transformer imports it); older releases in the model file.
for _name in ("timm.layers.attention.Attention", "timm.models.vision_transformer.Attention"):
    register_packed_attention(_name, _SPEC)
