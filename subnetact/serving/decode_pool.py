"""Large JSON request bodies parsed in child processes, so that parsing never holds the server's GIL.

``json.loads`` and ``np.asarray`` hold the GIL for the whole body (about 62 ms for a 1 MB body on the development
box). On a thread pool they still stop the event loop for that long each time: with bodies of 1 MiB admitted, three
clients posting them pushed another client's p50 to 15-30x its idle value (``docs/benchmarks.md``, issue 22). In a
child process the server's share of a body is copying it into a pipe, in chunks between which the event loop runs.

Each child (``_decode_child.py``, run as a script: it imports json and numpy, not torch) parses one body at a time
with :func:`~subnetact.serving.codec.decode_json`; a request waits for a free child without holding anything, so at
most ``size`` bodies are parsed at once whatever the number of clients posting them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import struct
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .codec import RequestError

__all__ = ["DecodePool", "DecodePoolError"]

_log = logging.getLogger("subnetact.serving")
_CHILD = Path(__file__).with_name("_decode_child.py")
CHILD_NICENESS = 10
"""Children run at this ``nice`` increment: when the CPU is short, parsing a large body waits, not the event loop or
the model."""


class DecodePoolError(RuntimeError):
    """A child died (or the exchange was interrupted) while parsing a body: the caller parses it another way."""


class DecodePool:
    """``size`` child processes parsing JSON bodies into float32 arrays of ``input_shape``.

    Children start on first use (a child is ready about 0.2 s after it starts: the time to import numpy) and are
    replaced when one dies. Bound to the event loop that first uses it.

    Args:
        input_shape: One request's input shape, e.g. ``(1, 8, 8)``; every array returned has it.
        size: Number of child processes, i.e. bodies parsed at once.
    """

    def __init__(self, input_shape: Sequence[int], size: int) -> None:
        self.input_shape = tuple(int(d) for d in input_shape)
        self.size = size
        self._nbytes = 4 * math.prod(self.input_shape)
        self._idle: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._children: set[asyncio.subprocess.Process] = set()
        self.restarts = 0  # children replaced after dying

    async def decode(self, body: bytes) -> tuple[np.ndarray, float | None]:
        """``(input float32 array of input_shape, budget_ms or None)``, as :func:`~.codec.decode_json` returns;
        raises its :class:`~.codec.RequestError` for a bad body, :class:`DecodePoolError` if the child failed."""
        child = await self._acquire()
        try:
            child.stdin.write(struct.pack("<Q", len(body)))
            child.stdin.write(body)
            await child.stdin.drain()
            kind = await child.stdout.readexactly(1)
            if kind == b"K":
                (budget,) = struct.unpack("<d", await child.stdout.readexactly(8))
                data = await child.stdout.readexactly(self._nbytes)
                result = (
                    np.frombuffer(data, np.float32).reshape(self.input_shape).copy(),
                    (None if math.isnan(budget) else budget),
                )
            elif kind == b"E":
                status, length = struct.unpack("<HI", await child.stdout.readexactly(6))
                error = RequestError(status, (await child.stdout.readexactly(length)).decode())
            else:
                raise DecodePoolError(f"the decode child answered {kind!r}")
        except BaseException as exc:
            # Broken pipe, EOF, or cancelled mid-exchange: this child's stream is out of step; replace it.
            self._discard(child)
            if isinstance(exc, (OSError, asyncio.IncompleteReadError)):
                raise DecodePoolError(f"the decode child failed: {type(exc).__name__}: {exc}") from None
            raise
        if self._idle is not None:  # not closed meanwhile
            self._idle.put_nowait(child)
        if kind == b"E":
            raise error
        return result

    async def _acquire(self) -> asyncio.subprocess.Process:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop (the old one's pipes are unusable)
            self.close()
            self._loop, self._idle = loop, asyncio.Queue()
            for _ in range(self.size):
                self._idle.put_nowait(await self._spawn())
        return await self._idle.get()

    async def _spawn(self) -> asyncio.subprocess.Process:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            str(_CHILD),
            ",".join(map(str, self.input_shape)),
            str(CHILD_NICENESS),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        self._children.add(child)
        return child

    def _discard(self, child: asyncio.subprocess.Process) -> None:
        self._children.discard(child)
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        if self._loop is None:  # closed: nothing to replace
            return
        self.restarts += 1
        _log.warning("a JSON decode child exited or was interrupted; starting another")
        idle = self._idle
        task = self._loop.create_task(self._spawn())
        task.add_done_callback(lambda t: t.cancelled() or t.exception() or idle.put_nowait(t.result()))

    async def aclose(self) -> None:
        """Stop the children and wait until they have exited and their pipes are closed."""
        children = list(self._children)
        self.close()
        for child in children:
            await child.wait()
            child._transport.close()  # asyncio would close it on its own a few iterations later; the loop may be gone

    def close(self) -> None:
        """Stop the children (they also exit by themselves when the server's end of their pipe closes)."""
        for child in self._children:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        self._children.clear()
        self._loop = self._idle = None
