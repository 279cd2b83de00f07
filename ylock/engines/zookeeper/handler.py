"""The kazoo handler of the ZooKeeper engine: kazoo's threading handler with a cheaper wait
and the engine's own watches run in the connection thread."""
from __future__ import annotations

import logging
import select
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.protocol.states import Callback

from ylock.engines.zookeeper.claim import Claim

logger = logging.getLogger(__name__)

# poll() masks (0 where there is no poll(): the engine keeps kazoo's own handler there).
_WAIT_READ = getattr(select, "POLLIN", 0) | getattr(select, "POLLPRI", 0)
_HUNG = getattr(select, "POLLERR", 0) | getattr(select, "POLLHUP", 0)
_NVAL = getattr(select, "POLLNVAL", 0)


class Handler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's threading handler (through kazoo's public extension point, ``handler=``) with
    two costs of every request taken out of kazoo's connection thread:

    * ``select``: kazoo's builds, registers and closes an epoll selector on every call (11 to
      44 µs here), about five times per request (wake up to send, wait to write, wake up
      to read, wait for the length, wait for the body: 18 calls per uncontended
      acquire+release); a ``poll`` object per call gives the same answers (a hung-up socket
      is readable and writable, as with ``select``) in about 2 µs. A closed socket goes to
      kazoo's own, so its errors stay kazoo's.
    * ``dispatch_callback``: the watches of this engine's claims never block (they set flags,
      post to a mailbox or send a request without waiting for it), so they run in the
      connection thread as the event is read, instead of waking kazoo's callback thread:
      one thread switch less per release (our own child watch fires at the delete) and per
      handoff (the waiter is woken straight from the connection thread). Every other watch
      (a user's, through ``engine.client``) goes to the callback thread as before, and so
      does the report of a loss (its subscribers are anybody's code: see
      :meth:`ylock.engines.zookeeper.session.Session.report_lost`).
    """

    def select(self, rlist: list[Any], wlist: list[Any], xlist: list[Any],
               timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
        if rlist and wlist:                  # kazoo never asks for both at once
            return super().select(rlist, wlist, xlist, timeout)  # type: ignore[no-any-return]
        watched, mask = (rlist, _WAIT_READ) if rlist else (wlist, select.POLLOUT)
        poller = select.poll()
        try:
            fds = [obj if isinstance(obj, int) else obj.fileno() for obj in watched]
            for fd in fds:
                poller.register(fd, mask)
        except (ValueError, OSError):        # a closed socket: kazoo's own select raises its error
            return super().select(rlist, wlist, xlist, timeout)  # type: ignore[no-any-return]
        ready = poller.poll(None if timeout is None else timeout * 1000)
        hit: list[Any] = []
        for fd, revents in ready:
            if revents & _NVAL:
                return super().select(rlist, wlist, xlist, timeout)  # type: ignore[no-any-return]
            if revents & (mask | _HUNG):
                hit.append(watched[fds.index(fd)])
        return (hit, [], []) if rlist else ([], hit, [])

    def dispatch_callback(self, callback: Callback) -> None:
        if callback.type == "watch" and isinstance(getattr(callback.func, "__self__", None), Claim):
            try:
                callback.func(*callback.args)
            except Exception:  # noqa: BLE001 - as kazoo's callback thread: log, go on
                logger.exception("ylock: a ZooKeeper watch failed")
            return
        super().dispatch_callback(callback)
