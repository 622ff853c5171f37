"""Request bodies -> (input array, deadline budget), and the errors that answer a malformed request.

Two body formats for ``POST /predict``:

- ``application/json``: ``{"input": <nested lists of numbers with the model's input shape, or flat>,
  "deadline_ms": <optional budget>}``.
- ``application/x-safetensors``: a `safetensors <https://huggingface.co/docs/safetensors>`_ blob holding one tensor
  named ``"input"`` (float32/float16/bfloat16/uint8/int ...; shape = the input shape, or with a leading 1). This is
  the compact binary format: 8 bytes of header length, a small JSON header, then the raw little-endian data; it is
  parsed without pickle, and :func:`encode_tensor` writes it.

The deadline is a *relative budget* in milliseconds: the ``deadline_ms`` field (a JSON number, not a string) or the
``X-Deadline-Ms`` header (plain decimal digits with an optional fraction, e.g. ``50`` or ``12.5``: no sign, exponent,
spaces or ``_``), not both; ``0 < budget <= MAX_DEADLINE_MS`` (10 minutes: a larger budget is no deadline at all).
The front end turns it into an absolute time when the request arrives.

:func:`default_max_body_bytes` is the body limit the front end uses unless told otherwise: what the largest valid
request for the input shape needs, not a fixed 1 MiB (see ``docs/benchmarks.md``, issue 22).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "JSON_TYPE",
    "TENSOR_TYPE",
    "RequestError",
    "decode_json",
    "decode_tensor",
    "default_max_body_bytes",
    "encode_tensor",
    "parse_budget_header",
    "parse_budget_ms",
]

JSON_TYPE = "application/json"
TENSOR_TYPE = "application/x-safetensors"
DEADLINE_HEADER = "x-deadline-ms"
MAX_DEADLINE_MS = 600_000.0
"""The largest deadline budget accepted (10 minutes)."""
_HEADER_BUDGET = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")
# A JSON number in the input needs at most this many bytes with its separator ("-1.2345678901234567e-300, "); the rest
# of a valid body (field names, nesting brackets, deadline) fits in the fixed allowance.
_JSON_BYTES_PER_VALUE = 32
_BODY_ALLOWANCE = 64 << 10


def default_max_body_bytes(input_shape: Sequence[int]) -> int:
    """The default body limit for inputs of ``input_shape``: room for the largest valid JSON body of that shape
    (32 bytes per value, every float written out in full) plus 64 KiB; for the (1, 8, 8) digits, 67,584 bytes.

    Anything larger cannot be a valid request, so it is refused with 413 from its ``Content-Length`` (or while it
    streams) before a byte of it is parsed.
    """
    return _JSON_BYTES_PER_VALUE * math.prod(input_shape) + _BODY_ALLOWANCE


class RequestError(ValueError):
    """A request the front end refuses; ``status`` is the HTTP status of the JSON error answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _range_error(value: Any, source: str, extra: str = "") -> RequestError:
    return RequestError(
        400, f"{source}={_short(value)} must be a number of milliseconds > 0 and <= {MAX_DEADLINE_MS:.0f}{extra}"
    )


def parse_budget_ms(value: Any, source: str) -> float:
    """A deadline budget in ms from a number (a JSON number, an argument): ``0 < value <= MAX_DEADLINE_MS``;
    ``RequestError(400)`` otherwise, strings included (``"50"`` is not a number)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= MAX_DEADLINE_MS
    ):
        raise _range_error(value, source, " (a number, not a string)" if isinstance(value, str) else "")
    return float(value)


def parse_budget_header(text: str, source: str = "X-Deadline-Ms") -> float:
    """A deadline budget in ms from a header value written as plain decimal digits (``50``, ``12.5``): no sign,
    exponent, spaces, ``_`` or non-ASCII digits; then :func:`parse_budget_ms`'s range."""
    if not _HEADER_BUDGET.fullmatch(text) or not 0 < float(text) <= MAX_DEADLINE_MS:
        raise _range_error(text, source, ", written as plain digits (e.g. 50 or 12.5)")
    return float(text)


def _check_input(x: np.ndarray, input_shape: Sequence[int], source: str) -> np.ndarray:
    shape = tuple(input_shape)
    if x.shape != shape:
        if x.shape == (1, *shape) or (x.ndim == 1 and x.size == math.prod(shape)):
            x = x.reshape(shape)
        else:
            raise RequestError(
                400,
                f"{source} has shape {list(x.shape)}; expected {list(shape)} (or flat with {math.prod(shape)} values)",
            )
    x = x.astype(np.float32, copy=False)
    if not np.isfinite(x).all():
        raise RequestError(400, f"{source} contains NaN or infinite values")
    return x


def decode_json(body: bytes, input_shape: Sequence[int]) -> tuple[np.ndarray, float | None]:
    """``(input float32 array of shape input_shape, budget_ms or None)`` from a JSON body."""
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise RequestError(400, f"the body must be a JSON object with an 'input' field, got {type(doc).__name__}")
    unknown = sorted(set(doc) - {"input", "deadline_ms"})
    if unknown:
        raise RequestError(400, f"unknown field(s) {unknown}; allowed: 'input', 'deadline_ms'")
    if "input" not in doc:
        raise RequestError(400, f"missing field 'input': numbers with shape {list(input_shape)}")
    raw = doc["input"]
    try:
        # No dtype: a ragged list raises, and strings/bools/None show up as a non-numeric dtype instead of being cast.
        x = np.asarray(raw)
    except (ValueError, TypeError):
        raise RequestError(400, f"input={_short(raw)} is not a rectangular array of numbers") from None
    if x.dtype.kind not in "iuf" or x.size == 0:
        raise RequestError(400, f"input={_short(raw)} must be numbers with shape {list(input_shape)}")
    budget = parse_budget_ms(doc["deadline_ms"], "deadline_ms") if "deadline_ms" in doc else None
    return _check_input(x, input_shape, "input"), budget


def decode_tensor(body: bytes, input_shape: Sequence[int]) -> np.ndarray:
    """The ``"input"`` tensor of a safetensors body as a float32 array of shape ``input_shape``."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        tensors = load(body)
    except (SafetensorError, ValueError, TypeError) as exc:
        raise RequestError(400, f"the body is not a valid safetensors blob: {exc}") from None
    if set(tensors) != {"input"}:
        raise RequestError(
            400, f"the safetensors body must hold exactly one tensor named 'input', got {sorted(tensors)}"
        )
    x = tensors["input"]
    if x.dtype.kind not in "iuf":
        raise RequestError(400, f"tensor 'input' has dtype {x.dtype}; expected a numeric dtype")
    return _check_input(x, input_shape, "tensor 'input'")


def encode_tensor(x: Any) -> bytes:
    """A request body in the binary format: ``x`` (array-like) as the safetensors tensor ``"input"``."""
    from safetensors.numpy import save

    return save({"input": np.ascontiguousarray(np.asarray(x))})
