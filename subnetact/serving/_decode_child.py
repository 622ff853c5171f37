"""The child process of :class:`subnetact.serving.decode_pool.DecodePool`: parses JSON bodies with
:func:`subnetact.serving.codec.decode_json`, one at a time, outside the server's process (and its GIL).

Run as a script (``python _decode_child.py D0,D1,... NICENESS``), not as a module of the package: importing
``subnetact`` would import torch (seconds and hundreds of MB per child) for a job that needs only json and numpy.
``codec.py`` has no package imports, so it is loaded from its file.

Protocol on stdin/stdout, little-endian:

- request: ``u64`` body length, then the body;
- answer ``b"K"``: ``f64`` budget in ms (NaN: none given), then the float32 input (the product of the shape x 4 bytes);
- answer ``b"E"``: ``u16`` HTTP status, ``u32`` length, the UTF-8 message of the :class:`RequestError`.
"""

from __future__ import annotations

import importlib.util
import math
import os
import struct
import sys
from pathlib import Path


def _load_codec():
    spec = importlib.util.spec_from_file_location("_subnetact_codec", Path(__file__).with_name("codec.py"))
    codec = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(codec)
    return codec


def _read_exact(stream, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def _error(out, status: int, text: str) -> None:
    message = text.encode()
    out.write(b"E" + struct.pack("<HI", status, len(message)) + message)


def main() -> None:
    shape = tuple(int(d) for d in sys.argv[1].split(","))
    os.nice(int(sys.argv[2]))  # below the server: on a busy CPU its event loop and model threads go first
    codec = _load_codec()
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while (head := _read_exact(inp, 8)) is not None:
        body = _read_exact(inp, struct.unpack("<Q", head)[0])
        if body is None:
            break
        try:
            x, budget = codec.decode_json(body, shape)
        except codec.RequestError as exc:
            _error(out, exc.status, str(exc))
        except Exception as exc:  # noqa: BLE001 - whatever else a hostile body does to the parser is a bad request
            _error(out, 400, f"the body could not be parsed: {type(exc).__name__}: {exc}")
        else:
            out.write(b"K" + struct.pack("<d", math.nan if budget is None else budget) + x.tobytes())
        out.flush()


if __name__ == "__main__":
    main()
