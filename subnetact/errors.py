"""Exception and warning types raised by subnetact.

Every exception also subclasses the builtin a caller would naturally catch (``ValueError``, ``TypeError``), so
``except ValueError`` keeps working while ``except SubnetActError`` catches everything the package raises.
"""


class SubnetActError(Exception):
    """Base class of every error subnetact raises on purpose."""


class InvalidSubnetError(SubnetActError, ValueError):
    """A subnet configuration does not belong to the model's search space (wrong length, value, type)."""


class UnsupportedModelError(SubnetActError, TypeError):
    """``convert`` met a model or block it has no rule for; the message names the module path and type."""


class ConfigError(SubnetActError, ValueError):
    """An option of ``convert`` (``ConvertConfig``, ``example_inputs``) or another argument has a value that is not
    allowed; the message names the argument, the value and what is allowed."""


class NotConvertedError(SubnetActError, TypeError):
    """A function that needs a converted supernet got a plain model (see ``subnetact.convert``)."""


class CheckpointError(SubnetActError, ValueError):
    """A checkpoint file is truncated, corrupted, or does not match the model it is loaded into."""


class UncalibratedSubnetWarning(UserWarning):
    """A subnet without calibrated SubnetNorm statistics was actuated; prefix-sliced statistics are used."""
