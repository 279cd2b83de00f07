"""The operations the ZooKeeper engine's steps yield, and their two executors: :func:`do`
(blocking, the sync API) and :func:`ado` (awaiting, the asyncio API), as
:func:`ylock.engines.base.run_steps` and :func:`~ylock.engines.base.arun_steps` drive them.

* :class:`Send`: send requests together (ZooKeeper answers a session's requests in order)
  and return their results in the same order; a result that is one of :data:`ANSWERS`
  (no node, node exists...) is returned as the exception, for the steps to read; any other
  error is raised.
* :class:`Wait`: wait for the next event of a claim's mailbox (None at its ``until``).
* :class:`Connect`: wait for the connection (EngineUnavailable at its ``until``).

Every operation carries an absolute time (``time.monotonic()``), never a duration: the
steps hand each the call's own deadline or bound, and the executors turn it into what a
wait takes at the last moment.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.handlers.threading import KazooTimeoutError

from ylock.engines.base import Mailbox, settle
from ylock.engines.zookeeper.session import Session

#: Errors a request's result may carry that the protocol handles itself.
ANSWERS = (NoNodeError, NodeExistsError, NotEmptyError, BadVersionError)

#: Request kinds.
CREATE, CHILDREN, EXISTS, GET, DELETE, SET = "create", "children", "exists", "get", "delete", "set"


class Request(NamedTuple):
    """One ZooKeeper request: ``arg`` is the data (create, set) or the watch (children,
    exists, get; None for none)."""

    kind: str
    path: str
    arg: Any = None


class Send(NamedTuple):
    """Send ``requests`` together; every result by ``end``."""

    requests: list[Request]
    end: float


class Wait(NamedTuple):
    """Wait until ``until`` (None: no limit) for an event of ``mailbox``."""

    mailbox: Mailbox
    until: float | None


class Connect(NamedTuple):
    """Wait until ``until`` for the connection."""

    until: float


def left(until: float) -> float:
    """Seconds from now to ``until`` (0 once it passed)."""
    return max(0.0, until - time.monotonic())


def start(client: KazooClient, req: Request) -> Any:
    """Send one request; return kazoo's asynchronous result."""
    kind, path = req.kind, req.path
    if kind == CREATE:
        return client.create_async(path, req.arg, ephemeral=True, sequence=True, makepath=True,
                                   include_data=True)
    if kind == CHILDREN:
        return client.get_children_async(path, watch=req.arg)
    if kind == EXISTS:
        return client.exists_async(path, watch=req.arg)
    if kind == GET:
        return client.get_async(path, watch=req.arg)
    if kind == DELETE:
        return client.delete_async(path)
    if kind == SET:
        return client.set_async(path, req.arg)
    raise ValueError(f"unknown request {kind!r}")


def do(session: Session, op: Send | Wait | Connect) -> Any:
    """Do one operation of the steps, blocking (the sync world's executor)."""
    if type(op) is Send:
        client = session.sendable()
        pending = [start(client, req) for req in op.requests]
        end = op.end
        results = []
        for result in pending:
            try:
                results.append(result.get(timeout=max(0.0, end - time.monotonic())))
            except ANSWERS as exc:
                results.append(exc)
        return results
    if type(op) is Wait:
        return op.mailbox.wait(None if op.until is None else left(op.until))
    if type(op) is Connect:
        session.wait_connected(left(op.until))
        return None
    raise TypeError(f"unknown operation {op!r}")


async def ado(session: Session, op: Send | Wait | Connect) -> Any:
    """Do one operation of the steps, awaiting it (the asyncio world's executor): kazoo's
    asynchronous results and watches resolve asyncio futures, so no thread waits."""
    if type(op) is Send:
        client = session.sendable()
        loop = asyncio.get_running_loop()
        futures = []
        for req in op.requests:
            future: asyncio.Future[Any] = loop.create_future()
            start(client, req).rawlink(lambda result, f=future: _resolve(loop, f, result))
            futures.append(future)
        gathered = asyncio.gather(*futures, return_exceptions=True)
        timeout = left(op.end)
        try:
            done = await asyncio.wait_for(gathered, timeout)
        except asyncio.TimeoutError:
            raise KazooTimeoutError(f"no answer within {timeout:.3g} s") from None
        except asyncio.CancelledError:
            # A cancelled gather ends with a CancelledError *exception* that nobody reads:
            # read it, or asyncio logs "exception was never retrieved" at every cancellation.
            gathered.add_done_callback(_consume)
            raise
        results = []
        for value in done:
            if isinstance(value, BaseException) and not isinstance(value, ANSWERS):
                raise value
            results.append(value)
        return results
    if type(op) is Wait:
        return await op.mailbox.await_(None if op.until is None else left(op.until))
    if type(op) is Connect:
        await session.await_connected(left(op.until))
        return None
    raise TypeError(f"unknown operation {op!r}")


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any) -> None:
    """kazoo's thread: copy an asynchronous result into an asyncio future."""
    try:
        value = result.get_nowait()
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
        loop.call_soon_threadsafe(settle, future, None, exc)
    else:
        loop.call_soon_threadsafe(settle, future, value, None)
