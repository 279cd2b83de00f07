"""The engine's Lua scripts, unchanged, run by Lua 5.1 (the version Redis embeds, through
``lupa.lua51``) against a :class:`~tests.simulation.model.Keyspace`.

What Redis does around a script and this host does the same way: ``KEYS``/``ARGV`` as
bulk strings; ``redis.call`` converts a Lua number argument with ``%.17g`` and raises on an
error reply, ``redis.pcall`` returns it as ``{err=...}``; replies become Lua values (integer
-> number, bulk -> string, nil -> false, array -> table, status -> ``{ok=...}``); the script's
return value becomes a reply (number -> integer, truncated; table -> array up to its first
nil; false -> nil; true -> 1). ``TIME`` answers the server's (virtual) clock.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lupa.lua51 as lupa

from tests.simulation.model import CommandError, Keyspace, Status, fmt_number

__all__ = ["ScriptError", "ScriptHost"]

_PRELUDE = """
local call_py = ...
redis = {}
local function wrap(ok, value)
  return value
end
function redis.call(...)
  local ok, value = call_py(false, ...)
  if not ok then error(value, 2) end
  return value
end
function redis.pcall(...)
  local ok, value = call_py(true, ...)
  return value
end
function redis.error_reply(msg) return {err = msg} end
function redis.status_reply(msg) return {ok = msg} end
"""


class ScriptError(Exception):
    """A script raised an error (Redis answers the EVALSHA with an error reply)."""


class ScriptHost:
    """One Lua 5.1 runtime with the scripts compiled once; :meth:`run` runs one against a
    keyspace at a server time (µs)."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.lua = lupa.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self.keyspace: Keyspace | None = None
        self.time_us = 0
        #: Called with (command, args) for every command a script sends (tests watch it).
        self.on_command: Callable[[str, tuple[bytes, ...]], None] | None = None
        self.lua.execute(_PRELUDE.encode(), self._call)
        self._table = self.lua.eval(b"function(...) return {...} end")
        self._ok = self.lua.eval(b"function(s) return {ok = s} end")
        self._err = self.lua.eval(b"function(s) return {err = s} end")
        self.scripts = {name: self._compile(name, source) for name, source in sources.items()}

    def _compile(self, name: str, source: str) -> Any:
        try:
            return self.lua.execute(b"return function(KEYS, ARGV)\n" + source.encode() + b"\nend")
        except lupa.LuaSyntaxError as exc:
            raise ScriptError(f"ERR Error compiling script {name}: {exc}") from exc

    # -- one script call ------------------------------------------------------------------

    def run(self, name: str, keyspace: Keyspace, time_us: int, keys: list[bytes], args: list[bytes]) -> Any:
        """Run script ``name`` (time frozen at ``time_us``); return its reply as Python
        values, or raise :class:`ScriptError` for an error reply."""
        self.keyspace = keyspace
        self.time_us = time_us
        keyspace.now_ms = time_us // 1000
        try:
            result = self.scripts[name](self._table(*keys), self._table(*args))
        except lupa.LuaError as exc:
            raise ScriptError(f"ERR Error running script {name}: {exc}") from None
        finally:
            self.keyspace = None
        return self._reply(result)

    def _call(self, protected: bool, name: Any = None, *args: Any) -> tuple[bool, Any]:
        """redis.call / redis.pcall: (ok, Lua value)."""
        if not isinstance(name, bytes):
            return False, self._err(b"ERR Please specify at least one argument for this redis lib call")
        argv = []
        for arg in args:
            if isinstance(arg, bytes):
                argv.append(arg)
            elif isinstance(arg, (int, float)) and not isinstance(arg, bool):
                argv.append(fmt_number(float(arg)))
            else:
                message = b"ERR Lua redis lib command arguments must be strings or integers"
                return (True, self._err(message)) if protected else (False, message)
        command = name.decode().upper()
        if self.on_command is not None:
            self.on_command(command, tuple(argv))
        keyspace = self.keyspace
        assert keyspace is not None
        try:
            if command == "TIME":
                reply: Any = [str(self.time_us // 1_000_000).encode(), str(self.time_us % 1_000_000).encode()]
            else:
                reply = keyspace.call(command, *argv)
        except CommandError as exc:
            message = str(exc).encode()
            return (True, self._err(message)) if protected else (False, message)
        return True, self._to_lua(reply)

    def _to_lua(self, reply: Any) -> Any:
        if reply is None:
            return False
        if isinstance(reply, Status):
            return self._ok(reply.encode())
        if isinstance(reply, list):
            return self._table(*(self._to_lua(x) for x in reply))
        return reply

    def _reply(self, value: Any) -> Any:
        """A script's return value as the client reads it."""
        if value is None or value is False:
            return None
        if value is True:
            return 1
        if isinstance(value, (int, float)):
            return int(value)
        if isinstance(value, bytes):
            return value
        # a table: a status, an error, or an array up to its first nil
        ok = value[b"ok"]
        if ok is not None:
            return Status(ok.decode())
        err = value[b"err"]
        if err is not None:
            raise ScriptError(err.decode())
        out = []
        i = 1
        while True:
            item = value[i]
            if item is None:
                break
            out.append(self._reply(item))
            i += 1
        return out


def fmt_args(args: list[Any]) -> list[bytes]:
    """Arguments as a client sends them (redis-py's encoding: str as UTF-8, numbers as text)."""
    out = []
    for arg in args:
        if isinstance(arg, bytes):
            out.append(arg)
        elif isinstance(arg, str):
            out.append(arg.encode())
        elif isinstance(arg, float):
            out.append(repr(arg).encode())
        else:
            out.append(str(arg).encode())
    return out
