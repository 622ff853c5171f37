"""Once-for-All (``mit-han-lab/once-for-all``, PyPI ``ofa``) interop: convert OFA supernets (``OFAResNets``,
``OFAMobileNetV3``, ``OFAProxylessNASNets``), translate OFA subnet dicts, load OFA checkpoints. Importing this
package never imports ``ofa``: the adapters are registered by class name and ``convert`` finds them when it meets
an OFA network.

    >>> from ofa.imagenet_classification.elastic_nn.networks import OFAResNets
    >>> model = subnetact.convert(OFAResNets(depth_list=[0, 1, 2], expand_ratio_list=[0.2, 0.25, 0.35],
    ...                                      width_mult_list=[0.65, 0.8, 1.0]))
    >>> subnetact.ofa.load_checkpoint(model, "ofa_resnet50.pth")
    >>> model.actuate(subnetact.SubnetConfig.from_ofa({"d": [0, 1, 1, 1, 1], "e": 0.25, "w": 1}, model))

See ``docs/ofa.md``.
"""

from .checkpoint import load_checkpoint, ofa_state_dict
from .config import from_ofa, to_ofa
from .mbv3 import ElasticKernelDepthwiseConv2d, OFAMobileNet
from .proxyless import OFAProxylessNet
from .resnet import OFAResNet

__all__ = [
    "ElasticKernelDepthwiseConv2d",
    "OFAMobileNet",
    "OFAProxylessNet",
    "OFAResNet",
    "from_ofa",
    "load_checkpoint",
    "ofa_state_dict",
    "to_ofa",
]
