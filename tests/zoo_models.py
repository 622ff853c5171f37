"""The table of tiny models that drives the convert / parity / export tests of the default (traced) analysis.

Each entry builds a small instance of a real architecture (torchvision classes with small settings, timm models
when timm is installed) and gives the input it takes. Sizes are chosen so every model converts and runs in well
under a second on a CPU.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from tiny_models import randomize_norms
from torch import nn

HAS_TIMM = importlib.util.find_spec("timm") is not None


@dataclass(frozen=True)
class ZooModel:
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    depth: bool  # whether the architecture has skippable residual blocks in a Sequential
    needs_timm: bool = False


def _tv(name: str, **kwargs) -> nn.Module:
    import torchvision

    return torchvision.models.get_model(name, num_classes=10, **kwargs)


def _convnext() -> nn.Module:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(16, 32, 2), CNBlockConfig(32, None, 2)], num_classes=10)


def _densenet() -> nn.Module:
    from torchvision.models.densenet import DenseNet

    return DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2, num_classes=10)


def _vit() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        image_size=32, patch_size=8, num_layers=3, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=10
    )


def _swin() -> nn.Module:
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[2, 2], num_classes=10
    )


def _vgg() -> nn.Module:
    from torchvision.models.vgg import VGG, make_layers

    model = VGG(make_layers([8, "M", 16, 16, "M"], batch_norm=True), num_classes=10)
    model.classifier = nn.Sequential(nn.Linear(16 * 7 * 7, 32), nn.ReLU(), nn.Linear(32, 10))
    return model


def _timm(name: str, **kwargs) -> nn.Module:
    import timm

    return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)


IMAGE = (2, 3, 32, 32)
ZOO: dict[str, ZooModel] = {
    "mobilenet_v2": ZooModel(partial(_tv, "mobilenet_v2", width_mult=0.25), IMAGE, depth=True),
    "mobilenet_v3_small": ZooModel(partial(_tv, "mobilenet_v3_small", width_mult=0.25), IMAGE, depth=True),
    "efficientnet_b0": ZooModel(partial(_tv, "efficientnet_b0"), IMAGE, depth=True),
    "regnet_x_400mf": ZooModel(partial(_tv, "regnet_x_400mf"), IMAGE, depth=True),
    "mnasnet0_5": ZooModel(partial(_tv, "mnasnet0_5"), IMAGE, depth=True),
    "shufflenet_v2_x0_5": ZooModel(partial(_tv, "shufflenet_v2_x0_5"), IMAGE, depth=False),
    "squeezenet1_1": ZooModel(partial(_tv, "squeezenet1_1"), (2, 3, 64, 64), depth=False),
    "convnext": ZooModel(_convnext, IMAGE, depth=True),
    "densenet": ZooModel(_densenet, IMAGE, depth=False),
    "vit": ZooModel(_vit, IMAGE, depth=True),
    "swin": ZooModel(_swin, IMAGE, depth=True),
    "vgg": ZooModel(_vgg, IMAGE, depth=False),
    "timm_resnet": ZooModel(partial(_timm, "resnet18"), IMAGE, depth=True, needs_timm=True),
    "timm_efficientnet": ZooModel(partial(_timm, "efficientnet_b0"), IMAGE, depth=True, needs_timm=True),
    "timm_mobilenetv3": ZooModel(partial(_timm, "mobilenetv3_small_050"), IMAGE, depth=True, needs_timm=True),
    "timm_convnext": ZooModel(partial(_timm, "convnext_atto"), IMAGE, depth=True, needs_timm=True),
    "timm_vit": ZooModel(
        partial(_timm, "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3), IMAGE, depth=True, needs_timm=True
    ),
    # LayerNorms over the attention output and the MLP hidden units: sliced with the heads / hidden units
    "timm_vit_scale_norm": ZooModel(
        partial(
            _timm,
            "vit_tiny_patch16_224",
            img_size=32,
            patch_size=8,
            depth=2,
            scale_attn_norm=True,
            scale_mlp_norm=True,
        ),
        IMAGE,
        depth=True,
        needs_timm=True,
    ),
}


def wake_up(model: nn.Module) -> nn.Module:
    """Give parameters initialised at (nearly) zero random values: ConvNeXt's layer scale (1e-6) and ViT's zero head
    would otherwise make every subnet's output (nearly) the original's, and the tests could not tell them apart."""
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() and p.abs().max() < 1e-3:
                p.copy_(torch.randn_like(p) * 0.5)
    return model


def build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return wake_up(randomize_norms(ZOO[name].build(), seed)).eval()


def inputs(name: str, seed: int = 1, batch: int | None = None) -> torch.Tensor:
    shape = ZOO[name].input_shape
    if batch is not None:
        shape = (batch, *shape[1:])
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))
