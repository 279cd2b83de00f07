"""The Redis engine's asyncio verbs, as a mixin of :class:`~ylock.engines.redis.engine.RedisEngine`
(a base class, not functions it calls: the lock path's first try and release are awaited in
the engine's own coroutine, with no coroutine of ours in between). They run the same steps
as the threads (:mod:`.steps`), awaited, on each event loop's connections (:mod:`.aio`)."""
from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING, Any

import redis.exceptions as rex

from ylock.engines.base import AcquireRequest, abandon_first, arun_steps, cancelling
from ylock.engines.redis.aio import AsyncSide, open_side
from ylock.engines.redis.calls import AsyncDirectCalls
from ylock.engines.redis.cluster import acluster_script_wait
from ylock.engines.redis.hubs import BLPOP_REFUSED, refused
from ylock.engines.redis.scripts import ACQUIRE, RELEASE, release_args
from ylock.engines.redis.steps import Acquire, Pop, Release, Sleep, acquire_steps, not_run, queued_too_late

__all__ = ["AsyncVerbs"]

if TYPE_CHECKING:
    from ylock.engines.redis.parts import EngineParts as _Engine
else:
    _Engine = object        # the engine's own attributes (a Protocol is no base class at run time)


class AsyncVerbs(_Engine):
    """``aacquire`` and ``arelease`` of the Redis engine, and the executor of their steps."""

    async def aacquire(self, request: AcquireRequest) -> int | None:
        r = request
        keys, args = self._request(r)
        loop = asyncio.get_running_loop()
        side = self._async.get(loop) or await open_side(self)
        tag = ""
        if side.hub is not None:
            # Grants go to the loop's hub, tagged with this request (see NotifyHub).
            tag = side.hub.tag()
            args[6] = f"{side.hub.hub_id}.{tag}"
        reply = None
        if not self.wait_replicas and (r.deadline is None or time.monotonic() < r.deadline):
            # The first try awaited here, as :meth:`acquire` does it: an uncontended lock costs
            # no steps and no executor. A cancellation meanwhile (also one a layer below
            # swallowed, see arun_steps) gives back what the try may have got, as the steps do.
            task = asyncio.current_task(loop)
            cancels = cancelling(task)
            script = self._scripts[ACQUIRE[r.mode]]
            try:
                try:        # _arun's call, in this coroutine (one coroutine less per acquisition)
                    end = time.monotonic() + self.socket_timeout
                    reply = await side.calls("EVALSHA", script.sha, len(keys), *keys, *args, end=end)
                except rex.NoScriptError:
                    reply = await self._areload(side, ACQUIRE[r.mode], keys, args, end)
            except asyncio.CancelledError:
                await self._abandon_first(side, r, keys, args)
                raise
            except Exception as exc:
                # A try that did not run (a slot migration, a congested pool) outlasted its time:
                # the steps try again until the deadline.
                if not (not_run(exc) and (r.deadline is None or time.monotonic() < r.deadline)):
                    raise self._translate(exc, r.group, r.name) from exc
            if cancelling(task) > cancels:
                await self._abandon_first(side, r, keys, args)
                raise asyncio.CancelledError
            if reply.__class__ is int:
                return reply
            if reply is not None and queued_too_late(r, reply):
                await self._abandon_first(side, r, keys, args)
                return None
        return await arun_steps(acquire_steps(self, r, keys, args, reply),  # type: ignore[no-any-return]
                                functools.partial(self._ado, side, tag=tag),
                                lambda exc: self._translate(exc, r.group, r.name))

    async def _abandon_first(self, side: AsyncSide, r: AcquireRequest, keys: tuple[str, ...], args: list[Any]) -> None:
        """Leave the queue and give back a grant after a first try whose task was cancelled
        (the steps' own clean-up: see :func:`abandon_first`)."""
        await abandon_first(acquire_steps(self, r, keys, args, None), functools.partial(self._ado, side),
                            lambda exc: self._translate(exc, r.group, r.name))

    async def arelease(self, group: str, name: str, owner: str, mode: str) -> bool:
        side = self._async.get(asyncio.get_running_loop()) or await open_side(self)
        keys = self._lock_keys.get((group, name, mode)) or self._keys_of(group, name, mode)     # see _lock_keys
        args = release_args(owner, mode)
        script = self._scripts[RELEASE[mode]]
        try:
            try:            # _arun's call, in this coroutine (see aacquire)
                end = time.monotonic() + self.socket_timeout
                reply = await side.calls("EVALSHA", script.sha, len(keys), *keys, *args, end=end)
            except rex.NoScriptError:
                reply = await self._areload(side, RELEASE[mode], keys, args, end)
        except Exception as exc:
            raise self._translate(exc, group, name) from exc
        return self._released(group, name, reply)

    async def _ado(self, side: AsyncSide, op: Acquire | Pop | Release | Sleep, tag: str = "") -> Any:
        """Do one operation of the steps, awaiting it (the asyncio world's executor); ``tag``
        names the acquisition's request in its loop's hub."""
        if isinstance(op, Acquire):
            if not self.wait_replicas:
                return await self._arun(side, op.script, op.keys, op.args, op.end), 0
            if self.kind == "redis+cluster":
                return await acluster_script_wait(side.client, self._scripts[op.script], op.keys, op.args,
                                                  self.wait_replicas, self.wait_timeout_ms)
            pipe = side.client.pipeline(transaction=False)
            pipe.evalsha(self._scripts[op.script].sha, len(op.keys), *op.keys, *op.args)
            pipe.wait(self.wait_replicas, self.wait_timeout_ms)
            reply, acked = await pipe.execute()
            return reply, int(acked)
        if isinstance(op, Pop):
            if side.hub is not None:
                return await side.hub.wait(f"{op.key}.{tag}", op.block)
            if side.pops <= 0 or "BLPOP" in self._refusals.commands:
                await asyncio.sleep(op.block)      # polling: the next try reads the lock's keys
                return None
            # A Cluster: this task blocks on its own notify key (routed to its slot's owner),
            # as a Cluster thread does, so a grant reaches it at once rather than at its next
            # poll (up to 0.5 s later; 8 tasks taking turns did ~5 acquisitions a second).
            side.pops -= 1
            try:
                return await side.calls("BLPOP", op.key, op.block, end=op.end)
            except rex.ResponseError as exc:
                if not refused(exc):
                    raise
                self._refusals.note("BLPOP", exc, *BLPOP_REFUSED)
                await asyncio.sleep(op.block)
                return None
            finally:
                side.pops += 1
        if isinstance(op, Release):
            return await self._arun(side, op.script, op.keys, op.args, op.end)
        await asyncio.sleep(op.seconds)
        return None

    async def _arun(self, side: AsyncSide, name: str, keys: tuple[str, ...], args: list[Any], end: float | None) -> Any:
        script = self._scripts[name]
        try:
            return await side.calls("EVALSHA", script.sha, len(keys), *keys, *args, end=end)
        except rex.NoScriptError:
            return await self._areload(side, name, keys, args, end)

    async def _areload(self, side: AsyncSide, name: str, keys: tuple[str, ...], args: list[Any],
                       end: float | None) -> Any:
        """Load a script the server answered ``NOSCRIPT`` for (a restart, a failover, SCRIPT
        FLUSH) and run it again."""
        script = self._scripts[name]
        if side.calls.__class__ is AsyncDirectCalls:     # see _run
            sha = await side.calls("SCRIPT", "LOAD", script.script, end=end)
            script.sha = sha.decode() if isinstance(sha, bytes) else sha
        else:
            script.sha = await side.client.script_load(script.script)
        return await side.calls("EVALSHA", script.sha, len(keys), *keys, *args, end=end)
