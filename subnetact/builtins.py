"""The one place built-in support is registered: block rules, model adapters and transformer families.

Each module below registers by qualified class name and imports nothing heavy (no torchvision, ``ofa`` or
``transformers``); ``import subnetact`` imports this module. Dependencies point from these interop packages to the
core, never back: the core's registries start empty and know none of them.
"""

from . import (
    hf,  # noqa: F401  (Hugging Face adapters and families)
    ofa,  # noqa: F401  (once-for-all adapters)
)
from .rules import timm_vit, torchvision_resnet  # noqa: F401  (timm ViT attention, torchvision ResNet block rules)
