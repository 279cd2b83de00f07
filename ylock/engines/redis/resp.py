"""RESP, the Redis protocol, for the lock path: commands packed into one buffer (script calls
remembered), replies parsed as redis-py's parsers make them. No I/O here: the threads' socket
calls are in :mod:`ylock.engines.redis.sockets`, the event loops' in
:mod:`ylock.engines.redis.asockets`."""
from __future__ import annotations

from typing import Any

import redis.connection
import redis.exceptions as rex
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer

__all__ = ["Incomplete", "Push", "pack", "packer", "parse", "split", "PACKED", "PACKED_SIZE"]


def packer(conn: Any) -> Any:
    """How to pack commands for ``conn``: :func:`pack` where it packs as the connection
    would (redis-py's Python serializer, UTF-8 strict), else the connection's own packer
    (hiredis's, or another encoding)."""
    encoder = conn.encoder
    own = getattr(conn, "_command_packer", None)      # None: redis.asyncio packs in Python
    if (own is None or own.__class__ in _SAME_BYTES) and encoder.encoding_errors == "strict" \
            and encoder.encoding.replace("-", "").replace("_", "").lower() == "utf8":
        return pack
    return conn.pack_command


#: The packers whose bytes :func:`pack` makes too (hiredis's encodes every str as UTF-8, as
#: redis-py's own does for a UTF-8 strict encoder; ints and bytes alike): with hiredis
#: installed, the lock path keeps its remembered script calls (a lookup instead of a pack
#: through redis-py's serializer and hiredis each time).
_SAME_BYTES = (PythonRespSerializer, getattr(redis.connection, "HiredisRespSerializer", PythonRespSerializer))


_encode = Encoder("utf-8", "strict", False).encode


def pack(*args: Any) -> list[bytes]:
    """Pack one command as redis-py's Python serializer does, in one buffer: about a quarter
    of its CPU for the lock path's commands (a dozen short str and int arguments), which
    redis-py's asyncio connections pack in Python even with hiredis. The command's name
    is one word (the lock path's commands are: no splitting of ``"CONFIG GET"``).

    Script calls are remembered (:data:`PACKED_CALLS`): a lock's acquire and release send the
    same arguments each time (the owner, the lease, the context), and looking them up
    costs a twentieth of packing them (0.2 µs against 4.5 for an acquisition's, timed on
    the benchmark machine)."""
    script = args[0] == "EVALSHA"
    if script:
        try:
            return PACKED_CALLS[args]
        except (KeyError, TypeError):               # TypeError: an unhashable buffer
            pass
    out = [b"*%d\r\n" % len(args)]
    append = out.append
    plain = True
    for arg in args:
        cls = arg.__class__
        if cls is str:
            arg = arg.encode()
        elif cls is int:
            arg = b"%d" % arg
        elif cls is not bytes:
            plain = False
            arg = _encode(arg)          # floats, buffers; what redis-py refuses raises its DataError
        append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    packed = [b"".join(out)]
    if script and plain and len(packed[0]) <= PACKED_SIZE:
        if len(PACKED_CALLS) >= PACKED:
            PACKED_CALLS.clear()
        PACKED_CALLS[args] = packed
    return packed


#: How many packed script calls :func:`pack` remembers (then it starts again: a process
#: that uses more locks at once than this packs most calls anew, as before).
PACKED = 1024
#: The longest packed call it remembers, in bytes (a lock's calls are about 150; a long
#: ``ylock.context``, mostly different every time, is not worth keeping): at most 512 KB in all.
PACKED_SIZE = 512
#: The packed script calls, by their arguments: only calls whose arguments are all str,
#: int and bytes are kept. (A float equal to a kept int, which the lock path never sends,
#: would find the int's packing: the same number to Redis.)
PACKED_CALLS: dict[tuple[Any, ...], list[bytes]] = {}


class Incomplete(Exception):
    """The buffer ends before the reply does."""


class Push(list):  # type: ignore[type-arg]
    """A RESP3 push message (not a reply): handed to redis-py's parser, which acts on it."""


def split(buf: bytes, error: Any) -> tuple[Any, bytes] | None:
    """The first whole reply in ``buf`` (see :func:`parse`) and the bytes after it, or None
    if ``buf`` ends before a reply does."""
    if not buf:
        return None
    try:
        reply, end = parse(buf, 0, error)
    except Incomplete:
        return None
    return reply, buf[end:]


def parse(buf: bytes, at: int, error: Any) -> tuple[Any, int]:
    """The RESP2/RESP3 reply at ``buf[at:]`` and where it ends, as redis-py's parsers make
    it (bulk and simple strings as bytes, a set as a list, an error reply as
    ``error(message)``'s exception, returned; a push message as a :class:`Push`);
    :class:`Incomplete` if the buffer ends before it does."""
    line = buf.find(b"\r\n", at)
    if line < 0:
        raise Incomplete
    kind = buf[at]
    if kind == 58 or kind == 40:                        # ":" integer, "(" big number
        return int(buf[at + 1:line]), line + 2
    if kind == 36 or kind == 61 or kind == 33:          # "$" bulk, "=" verbatim, "!" blob error
        size = int(buf[at + 1:line])
        if size < 0:
            return None, line + 2
        end = line + 2 + size
        if len(buf) < end + 2:
            raise Incomplete
        if kind == 36:
            return buf[line + 2:end], end + 2
        if kind == 61:
            return buf[line + 6:end], end + 2          # less its "txt:" format
        return _error(error, buf[line + 2:end]), end + 2
    if kind == 42 or kind == 126 or kind == 62:         # "*" array, "~" set, ">" push
        count = int(buf[at + 1:line])
        if count < 0:
            return None, line + 2
        items: list[Any] = Push() if kind == 62 else []
        at = line + 2
        for _ in range(count):
            item, at = parse(buf, at, error)
            items.append(item)
        return items, at
    if kind == 37:                                      # "%" map
        count = int(buf[at + 1:line])
        out: dict[Any, Any] = {}
        at = line + 2
        for _ in range(count):
            key, at = parse(buf, at, error)
            out[key], at = parse(buf, at, error)
        return out, at
    if kind == 43:                                      # "+" simple string
        return buf[at + 1:line], line + 2
    if kind == 45:                                      # "-" error
        return _error(error, buf[at + 1:line]), line + 2
    if kind == 95:                                      # "_" null
        return None, line + 2
    if kind == 35:                                      # "#" boolean
        return buf[at + 1:line] == b"t", line + 2
    if kind == 44:                                      # "," double
        return float(buf[at + 1:line]), line + 2
    raise rex.InvalidResponse(f"Protocol Error: {buf[at:line]!r}")


def _error(error: Any, message: bytes) -> Any:
    """An error reply's exception, as redis-py's parsers make it (a connection error is
    raised at once, wherever it is)."""
    exc = error(message.decode("utf-8", "replace"))
    if isinstance(exc, rex.ConnectionError):
        raise exc
    return exc

