"""The one number check: what counts as an int or a real number in an argument.

``bool`` is an ``int`` subclass, but ``True`` as a count or a size is almost certainly a bug, so neither check accepts
it. Each caller keeps its own error message (naming the argument, the value and what is allowed).
"""

from __future__ import annotations

import math
from typing import Any


def is_int(value: Any) -> bool:
    """Whether ``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any, *, finite: bool = False) -> bool:
    """Whether ``value`` is an ``int`` or a ``float``, not a ``bool`` (and, with ``finite``, neither inf nor NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not finite or math.isfinite(value)
