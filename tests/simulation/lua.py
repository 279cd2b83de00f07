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

from tests.simulation.model import CommandError, Keyspace, Status, command_handler, fmt_number

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

-- A value as Redis replies it, flattened for one crossing into Python (always two values
-- or more): "err"/"ok" and the message, "val" and the value, or "arr", the number of the
-- array's items up to its first nil and the items (a nested table stays a table).
local function flat(v)
  if type(v) ~= 'table' then return 'val', v end
  if v.err then return 'err', v.err end
  if v.ok then return 'ok', v.ok end
  local n = 0
  while v[n + 1] ~= nil do n = n + 1 end
  return 'arr', n, unpack(v, 1, n)
end
sim_flat = flat

-- Run a script with its KEYS (the first nkeys values) and ARGV: flat(its value), or
-- "raise" and the error's message.
function sim_run(f, nkeys, ...)
  local all, keys, argv = {...}, {}, {}
  for i = 1, nkeys do keys[i] = all[i] end
  for i = nkeys + 1, select('#', ...) do argv[i - nkeys] = all[i] end
  local ok, v = pcall(f, keys, argv)
  if not ok then return 'raise', v end
  return flat(v)
end
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
        lua_globals = self.lua.globals()
        self._run = lua_globals.sim_run
        self._flat = lua_globals.sim_flat
        self._table = self.lua.eval(b"function(...) return {...} end")
        #: The commands by their name as a script spells it (bytes), built as they are met.
        self._handlers: dict[Any, Callable[..., Any]] = {}
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
            out = self._run(self.scripts[name], len(keys), *keys, *args)
        finally:
            self.keyspace = None
        if out[0] == b"raise":
            raise ScriptError(f"ERR Error running script {name}: {_text(out[1])}")
        return self._value(out)

    def _value(self, out: tuple[Any, ...]) -> Any:
        """A reply from its flattened form (see ``flat`` in the prelude)."""
        kind = out[0]
        if kind == b"arr":
            return [self._item(x) for x in out[2:]]
        if kind == b"val":
            return self._item(out[1])
        if kind == b"ok":
            return Status(out[1].decode())
        raise ScriptError(out[1].decode())

    def _item(self, value: Any) -> Any:
        """A script's return value (or an item of it) as the client reads it."""
        cls = value.__class__
        if cls is bytes:
            return value
        if cls is int or cls is float:
            return int(value)
        if value is None or value is False:
            return None
        if value is True:
            return 1
        return self._value(self._flat(value))    # a table

    def _call(self, protected: bool, name: Any = None, *args: Any) -> tuple[bool, Any]:
        """redis.call / redis.pcall: (ok, Lua value)."""
        handler = self._handlers.get(name)
        if handler is None or self.on_command is not None:
            return self._call_slowly(protected, name, args)
        for arg in args:
            if arg.__class__ is not bytes:
                if arg.__class__ is not int and arg.__class__ is not float:
                    return self._call_slowly(protected, name, args)
                args = tuple(a if a.__class__ is bytes else fmt_number(float(a)) for a in args)
                break
        try:
            return True, self._to_lua(handler(self.keyspace, *args))
        except CommandError as exc:
            message = str(exc).encode()
            return (True, self._err(message)) if protected else (False, message)

    def _call_slowly(self, protected: bool, name: Any, args: tuple[Any, ...]) -> tuple[bool, Any]:
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
        handler = _time if command == "TIME" else command_handler(command)
        if handler is not None:
            self._handlers[name] = handler
        try:
            if handler is None:
                raise CommandError(f"ERR unknown command '{command}'")
            reply = handler(keyspace, *argv)
        except CommandError as exc:
            message = str(exc).encode()
            return (True, self._err(message)) if protected else (False, message)
        return True, self._to_lua(reply)

    def _to_lua(self, reply: Any) -> Any:
        cls = reply.__class__
        if cls is bytes or cls is int:
            return reply
        if reply is None:
            return False
        if cls is list:
            return self._table(*[self._to_lua(x) for x in reply])
        if cls is _TimeNow:
            assert self.keyspace is not None
            return self._table(str(self.time_us // 1_000_000).encode(), str(self.time_us % 1_000_000).encode())
        if isinstance(reply, Status):
            return self._ok(reply.encode())
        return reply


class _TimeNow:
    """TIME's answer, made by the host (which knows the server's clock)."""


def _time(keyspace: Keyspace) -> _TimeNow:
    return _TIME_NOW


_TIME_NOW = _TimeNow()


def _text(message: Any) -> str:
    return message.decode(errors="replace") if isinstance(message, bytes) else str(message)


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
