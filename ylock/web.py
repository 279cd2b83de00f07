"""Locking around web requests, framework-free: the one behaviour behind Django's and
Flask's ``@locked`` and ``@limited`` views and per-user locks. The plugins only translate their request
objects and settings into these calls, so both answer the same requests the same way.

- **Which lock.** ``key`` picks one lock of a named family per request: a URL value
  (escaped into a valid lock name, one per value: ``/``, ``.`` and the like never reach a
  server, and a value too long is hashed; :func:`ylock.names.name_for`), the result of a
  callable, or who the request is (:mod:`ylock.clients`: the logged-in user, else a keyed
  hash of the client's credential, else of the session it already has; never a new
  session, and no lock for a request that nothing identifies).
- **How long.** A request waits for its lock up to the decorator's ``timeout``, else the
  lock's ``TIMEOUT`` setting, else :data:`DEFAULT_TIMEOUT` seconds: a web worker must
  not wait forever unless told to (``timeout=None``).
- **How many.** ``@limited`` views (and the per-user lock with ``PERMITS`` > 1) take a
  permit of a semaphore instead of a lock: at most N requests per key in flight at once,
  across every process and machine on the engine.
- **The answers.** A lock that cannot be had in time answers 423 Locked (configurable)
  with ``Retry-After`` and a JSON body; a request over its concurrency limit answers 429
  Too Many Requests with the same headers and body shape; an unreachable engine answers
  503 with a body that does not disclose the engine's address (that goes to the log).
- **What it is doing.** Every hold taken for a request says so (:func:`request_context`:
  ``"POST /orders/7"``, never the query string nor anything of the user or session), as
  ``engine.describe()``, ``ylock list`` and the admin page show it.
- **Which lock it holds.** While the view runs, the plugins' ``current_lock()`` returns the
  lock (or semaphore) the request holds (:class:`Held`), so the view can pass its fencing
  token to a fenced write.
- **The quiet release.** Once the view has run, a lost lease or an unreachable engine at
  release is logged, not turned into an error page: the view's answer stands.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Union

from ylock import clients
from ylock import options as opt
from ylock.engines.base import PERMIT, READ, WRITE
from ylock.errors import ConfigurationError, EngineUnavailable, LockLost, LockTimeout
from ylock.guard import DEFAULT
from ylock.lock import Lock
from ylock.names import check_group, check_name, name_for
from ylock.owner import owner_scope
from ylock.semaphore import Semaphore

logger = logging.getLogger(__name__)

#: Seconds a request waits for its lock when neither the view nor the lock's settings say.
DEFAULT_TIMEOUT = 5.0
#: Status of the answer to a request over its concurrency limit (``@limited``, ``PERMITS``).
LIMITED_STATUS = 429
#: Methods that take the read lock under the per-user lock.
READ_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")
#: Retry-After of a 503 answer.
UNAVAILABLE_RETRY = 5
#: Reason phrases, as both plugins send them (Werkzeug would write "423 LOCKED").
REASONS = {423: "Locked", 429: "Too Many Requests", 503: "Service Unavailable"}

#: The plugin settings shared by Django (``YLOCK[KEY]``) and Flask (``YLOCK_KEY``), with defaults.
SETTINGS: dict[str, Any] = {
    "USER_LOCK": None,       # per-user lock around requests: True or a dict (USER_LOCK_DEFAULTS)
    "LOCKED_STATUS": 423,    # status of the answer when a request cannot get its lock in time
    "RETRY_AFTER": None,     # Retry-After seconds on that answer and on 429s (default: the timeout, at least 1)
    "ON_LOCKED": None,       # callable(request, exc) (or its dotted path) answering instead of a 423
    "CLIENT_KEY": None,      # who a request without a logged-in user is (ylock.clients): callable(request)
                             # -> str | None (or its dotted path); None: the Authorization header; False: none
}
USER_LOCK_DEFAULTS: dict[str, Any] = {
    "LOCK": "users",         # the named Locks family; one lock per user
    "PATHS": ["/"],          # URL path prefixes that take the lock
    "EXCLUDE": [],           # prefixes that do not (checked first)
    "TIMEOUT": DEFAULT_TIMEOUT,
    "ANONYMOUS": "session",  # no user, no client key: "session": the session it has (never a new one); "skip": no lock
    "READ_METHODS": list(READ_METHODS),
    "PERMITS": 1,            # requests of one user in flight at once: 1 is the read/write lock,
                             # N > 1 a semaphore of N permits per user (429 beyond)
}

#: The families this process locks one key at a time (by a URL value, a callable, the user),
#: with how, as ``@locked``, ``@limited`` and USER_LOCK declared them: their lock names are
#: unbounded, so :func:`ylock.metrics.keyed_groups` tells the checks not to label them by name.
KEYED: dict[str, str] = {}

#: The lock name of a logged-in user (kept here too: :mod:`ylock.clients` is its home now).
user_name = clients.user_name

#: What a request holds: a lock (``@locked``, the per-user lock) or a semaphore's permit
#: (``@limited``, the per-user lock with PERMITS > 1).
Target = Union[Lock, Semaphore]


# -- settings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class UserLock:
    """Validated per-user lock settings."""

    lock: str
    paths: tuple[str, ...]
    exclude: tuple[str, ...]
    timeout: float | None
    anonymous: str
    read_methods: frozenset[str]
    permits: int = 1

    def covers(self, path: str) -> bool:
        """Return True if a request for ``path`` takes the user's lock."""
        return not path.startswith(self.exclude) and path.startswith(self.paths)

    def mode(self, method: str) -> str:
        """The mode a request of ``method`` holds: read or write, or a permit (PERMITS > 1)."""
        if self.permits > 1:
            return PERMIT
        return READ if method in self.read_methods else WRITE

    def specs(self) -> dict[str, LockSpec | LimitSpec]:
        """What a request of each :meth:`mode` asks for (build once per settings): the read
        and write lock of the user, or (PERMITS > 1) a permit of the user's semaphore."""
        if self.permits > 1:
            return {PERMIT: LimitSpec(self.lock, permits=self.permits, key=None, timeout=self.timeout,
                                      anonymous=self.anonymous, decorator="USER_LOCK")}
        return {mode: LockSpec(self.lock, key=None, mode=mode, timeout=self.timeout, anonymous=self.anonymous,
                               decorator="USER_LOCK") for mode in (READ, WRITE)}


@dataclass(frozen=True)
class WebSettings:
    """The validated plugin settings of one Django project or Flask app."""

    user_lock: UserLock | None = None
    locked_status: int = 423
    retry_after: int | None = None
    on_locked: Callable[..., Any] | None = None
    client_key: clients.ClientKey | None = clients.authorization


def web_settings(values: Mapping[str, Any], where: Callable[[str], str],
                 problems: list[ConfigurationError] | None = None) -> WebSettings:
    """Validate the plugin settings ``values`` (keys of :data:`SETTINGS`; missing ones take
    their default); ``where(key)`` names a key as the user wrote it (``YLOCK['USER_LOCK']``
    or ``YLOCK_USER_LOCK``). Raise ConfigurationError naming the first bad one; or, given a
    ``problems`` list, append each bad key's error to it and use that key's default (a
    settings check reports every problem, each key validated once)."""
    s = {**SETTINGS, **{k: v for k, v in values.items() if v is not None}}

    def checked(key: str, check: Callable[[Any], Any]) -> Any:
        try:
            return check(s[key])
        except ConfigurationError as exc:
            if problems is None:
                raise
            problems.append(exc)
            return check(SETTINGS[key])

    def retry_after(value: Any) -> int | None:
        return None if value is None else opt.number(value, where("RETRY_AFTER"), minimum=0, maximum=86400,
                                                     integer=True, code=opt.E_RESPONSE)

    def on_locked(value: Any) -> Callable[..., Any] | None:
        return None if value is None else opt.importable(value, where("ON_LOCKED"), code=opt.E_RESPONSE, call=True)

    return WebSettings(
        user_lock=checked("USER_LOCK", lambda value: user_lock_settings(value, where("USER_LOCK"))),
        locked_status=checked("LOCKED_STATUS", lambda value: opt.number(
            value, where("LOCKED_STATUS"), minimum=400, maximum=599, integer=True, code=opt.E_RESPONSE)),
        retry_after=checked("RETRY_AFTER", retry_after),
        on_locked=checked("ON_LOCKED", on_locked),
        client_key=checked("CLIENT_KEY", lambda value: clients.client_key_setting(value, where("CLIENT_KEY"))))


def user_lock_settings(value: Any, where: str) -> UserLock | None:
    """Validate a USER_LOCK setting (None or False: off; True: the defaults)."""
    if value is None or value is False:
        return None
    conf = opt.section({} if value is True else value, where, USER_LOCK_DEFAULTS, code=opt.E_USER_LOCK)
    check = f"{where}['%s']"
    lock = opt.text(conf["LOCK"], check % "LOCK", code=opt.E_USER_LOCK)
    try:
        check_name(lock)
    except ValueError as exc:
        raise opt.fail(check % "LOCK", f"is invalid: {exc}", opt.E_USER_LOCK) from exc
    return UserLock(
        lock=lock,
        paths=tuple(opt.strings(conf["PATHS"], check % "PATHS", code=opt.E_USER_LOCK, prefix="/")),
        exclude=tuple(opt.strings(conf["EXCLUDE"], check % "EXCLUDE", code=opt.E_USER_LOCK, prefix="/")),
        timeout=opt.timeout(conf["TIMEOUT"], check % "TIMEOUT", code=opt.E_USER_LOCK),
        anonymous=opt.choice(conf["ANONYMOUS"], check % "ANONYMOUS", ("session", "skip"), code=opt.E_USER_LOCK),
        read_methods=frozenset(m.upper() for m in opt.strings(conf["READ_METHODS"], check % "READ_METHODS",
                                                               code=opt.E_USER_LOCK)),
        permits=opt.number(conf["PERMITS"], check % "PERMITS", minimum=1, maximum=1_000_000, integer=True,
                           code=opt.E_USER_LOCK))


# -- the answers ---------------------------------------------------------------------------------


class Refusal(NamedTuple):
    """An answer instead of the view: status, reason phrase, JSON body, headers."""

    status: int
    reason: str
    body: dict[str, Any]
    headers: dict[str, str]


def busy(lock: Lock, mode: str, retry_after: int, status: int = 423) -> Refusal:
    """The answer to a request whose lock is busy (423 Locked unless configured)."""
    body = {"error": "locked", "lock": f"{lock.group}/{lock.name}", "retry_after": retry_after,
            "detail": f"the {mode} lock {lock.group}/{lock.name} is busy; retry later"}
    return Refusal(status, REASONS.get(status, "Locked"), body, {"Retry-After": str(retry_after)})


def limited(semaphore: Semaphore, retry_after: int, status: int = LIMITED_STATUS) -> Refusal:
    """The answer to a request over its concurrency limit (429 Too Many Requests unless
    configured): the body has the shape of :func:`busy`'s."""
    name, permits = f"{semaphore.group}/{semaphore.name}", semaphore.permits
    taken = f"the permit of {name} is taken" if permits == 1 else f"the {permits} permits of {name} are all taken"
    body = {"error": "limited", "lock": name, "retry_after": retry_after, "detail": f"{taken}; retry later"}
    return Refusal(status, REASONS.get(status, "Too Many Requests"), body, {"Retry-After": str(retry_after)})


def unavailable(lock: Target, exc: Exception) -> Refusal:
    """The answer to a request whose lock's engine cannot be reached (503); the engine's
    address and the error go to the log, not to the client."""
    logger.error("ylock: engine unavailable for %s/%s: %s", lock.group, lock.name, exc)
    body = {"error": "lock engine unavailable", "lock": f"{lock.group}/{lock.name}",
            "retry_after": UNAVAILABLE_RETRY, "detail": "the lock service is unavailable; retry later"}
    return Refusal(503, REASONS[503], body, {"Retry-After": str(UNAVAILABLE_RETRY)})


def request_context(method: str, path: str) -> str:
    """What the holds of a request say it is doing: ``"GET /orders/7"``. The query string
    is cut off (it may hold tokens), and nothing of the user or session is added; the core
    bounds the length (:data:`ylock.owner.MAX_CONTEXT`)."""
    return f"{method} {path.partition('?')[0]}"


def retry_after(timeout: float | None, configured: int | None) -> int:
    """Retry-After seconds: the configured value, else the timeout rounded up (at least 1)."""
    if configured is not None:
        return configured
    return max(1, math.ceil(timeout or 1))


# -- holding ----------------------------------------------------------------------------------


class RequestSpec:
    """What a decorated view (or the per-user lock) asks for, validated once when the
    decorator is applied: which family (``name``), which member per request (``key``), how
    long to wait and what to answer. A name that can never be a lock fails here, not per
    request. :class:`LockSpec` holds a lock, :class:`LimitSpec` a semaphore's permit."""

    #: How the user wrote it, for messages ("@locked", "@limited", "USER_LOCK").
    decorator = "@locked"
    #: What a request holds of the family, for messages.
    kind = "lock"

    def __init__(self, name: str, *, key: Any = None, timeout: Any = DEFAULT, status: int | None = None,
                 retry_after: int | None = None, anonymous: str = "session", decorator: str | None = None) -> None:
        if decorator is not None:
            self.decorator = decorator
        at = self.decorator
        try:
            self.name = check_name(name)
        except (TypeError, ValueError) as exc:
            raise opt.fail(f"{at} name", f"{name!r} is not a valid lock name: {exc}", opt.E_LOCK_OPTION) from exc
        if not (key is None or key is False or isinstance(key, str) or callable(key)):
            raise opt.fail(f"{at} key", f"must be a URL argument name, a callable, None (the user) or False "
                           f"(the named {self.kind} itself), got {key!r}", opt.E_LOCK_OPTION)
        self.key = key
        if key is not False:        # one lock per key: a label by name would grow with the keys
            how = "the user" if key is None else repr(key) if isinstance(key, str) else getattr(key, "__name__", "...")
            KEYED.setdefault(self.name, "USER_LOCK (one lock per user)" if at == "USER_LOCK" else
                             f"{at}({self.name!r}, key={how})")
        self.timeout = timeout if timeout is DEFAULT else opt.timeout(timeout, f"{at} timeout")
        self.status = None if status is None else opt.number(status, f"{at} status", minimum=400, maximum=599,
                                                              integer=True)
        self.retry_after = None if retry_after is None else opt.number(retry_after, f"{at} retry_after",
                                                                       minimum=0, integer=True)
        self.anonymous = opt.choice(anonymous, f"{at} anonymous", ("session", "skip"))

    def key_value(self, kwargs: Mapping[str, Any], call: Callable[[], object], user: Callable[[], str | None]) -> \
            str | None:
        """Return the name of the request's lock in the family, None for no lock (an anonymous
        visitor when skipped), or ``""`` for the named lock itself (``key=False``).
        ``kwargs``: the view's URL arguments; ``call()`` runs a callable key; ``user()``
        returns the user's or session's lock name."""
        if self.key is False:
            return ""
        if self.key is None:
            return user()
        if isinstance(self.key, str):
            if self.key not in kwargs:
                raise opt.fail(f"{self.decorator}({self.name!r}, key={self.key!r}):", f"the view got no URL argument "
                               f"{self.key!r} (it got {sorted(kwargs)})", opt.E_LOCK_OPTION)
            return name_for(kwargs[self.key])
        value = call()
        return None if value is None else name_for(value)

    def mode_for(self, request: object) -> str:
        """The mode the request holds its target in."""
        raise NotImplementedError

    def target(self, registry: Any, key: str) -> Target:
        """The request's lock or semaphore, for ``key`` from :meth:`key_value` (not None)."""
        raise NotImplementedError

    def timeout_for(self, registry: Any) -> float | None:
        """The wait: the decorator's timeout, else the lock's TIMEOUT setting, else the default."""
        if self.timeout is not DEFAULT:
            return self.timeout
        options = registry.lock_options(self.name)
        return options.timeout if options.timeout_set else DEFAULT_TIMEOUT


class LockSpec(RequestSpec):
    """What ``@locked(name, key=..., mode=..., timeout=...)`` asks for (see :class:`RequestSpec`)."""

    def __init__(self, name: str, *, key: Any = None, mode: Any = WRITE, timeout: Any = DEFAULT,
                 status: int | None = None, retry_after: int | None = None, anonymous: str = "session",
                 decorator: str | None = None) -> None:
        super().__init__(name, key=key, timeout=timeout, status=status, retry_after=retry_after,
                         anonymous=anonymous, decorator=decorator)
        if not callable(mode):
            opt.choice(mode, f"{self.decorator} mode", (READ, WRITE))
        self.mode = mode

    def mode_for(self, request: object) -> str:
        mode = self.mode(request) if callable(self.mode) else self.mode
        return str(opt.choice(mode, f"{self.decorator} mode callable's result", (READ, WRITE)))

    def target(self, registry: Any, key: str) -> Lock:
        return registry.lock(self.name) if key == "" else registry.locks(self.name)[key]  # type: ignore[no-any-return]


class LimitSpec(RequestSpec):
    """What ``@limited(name, permits=..., key=..., timeout=0)`` asks for: a permit of the
    ``name`` family's semaphore for the request's key (``key=False``: of the named
    semaphore itself), so that at most ``permits`` requests per key are in flight. Without
    ``permits``, the PERMITS of ``name`` in the LOCKS setting (:meth:`check` says when there
    is none). ``timeout``: seconds to wait for a permit (default 0: answer 429 at once)."""

    decorator = "@limited"
    kind = "semaphore"

    def __init__(self, name: str, *, permits: int | None = None, key: Any = None, timeout: Any = 0.0,
                 status: int | None = None, retry_after: int | None = None, anonymous: str = "session",
                 decorator: str | None = None) -> None:
        super().__init__(name, key=key, timeout=timeout, status=status, retry_after=retry_after,
                         anonymous=anonymous, decorator=decorator)
        self.permits = None if permits is None else opt.number(permits, f"{self.decorator} permits", minimum=1,
                                                               maximum=1_000_000, integer=True)

    def check(self, registry: Any) -> None:
        """Raise ConfigurationError unless the permits are known: given, or the PERMITS of
        ``name`` in the settings (which are validated there)."""
        try:
            options = registry.lock_options(self.name)
        except ConfigurationError:
            return              # a problem of the settings themselves: their own check names it
        if self.permits is None and options.permits is None:
            raise opt.fail(f"{self.decorator}({self.name!r})", f"needs permits=N, or PERMITS in "
                           f"{registry.setting('LOCKS', self.name)}", opt.E_LOCK_OPTION,
                           f"e.g. {registry.setting('LOCKS')} = {{{self.name!r}: {{'PERMITS': 3}}}}")

    def mode_for(self, request: object) -> str:
        return PERMIT

    def target(self, registry: Any, key: str) -> Semaphore:
        if key == "":
            return registry.semaphore(self.name, self.permits)  # type: ignore[no-any-return]
        return registry.semaphores(self.name, self.permits)[key]  # type: ignore[no-any-return]


def check_family_name(name: str) -> None:
    """Raise ConfigurationError unless ``name`` can be a lock family whose group defaults to it."""
    try:
        check_group(name)
    except ValueError as exc:
        raise opt.fail("lock name", f"{name!r} cannot be a lock group ({exc}); give it a GROUP in the LOCKS "
                       "setting", opt.E_LOCK_OPTION) from exc


def enter(lock: Target, mode: str, timeout: float | None, settings: WebSettings, *, retry: int | None = None,
          status: int | None = None, custom: bool = False) -> Refusal | LockTimeout | None:
    """Acquire for a request (``mode`` "write" or "read"; a semaphore's "permit"); return
    None (go on) or the Refusal to answer (a busy lock: 423 or ``status``; no permit left:
    429 or ``status``; an unreachable engine: 503). With ``custom`` (an ON_LOCKED handler
    answers instead), a busy lock returns the LockTimeout for the handler."""
    try:
        got = lock.guard(mode).try_acquire(timeout)
    except EngineUnavailable as exc:
        return unavailable(lock, exc)
    return None if got else _refusal(lock, mode, timeout, settings, retry, status, custom)


async def aenter(lock: Target, mode: str, timeout: float | None, settings: WebSettings, *,
                 retry: int | None = None, status: int | None = None,
                 custom: bool = False) -> Refusal | LockTimeout | None:
    """:func:`enter` for async views: waits without a thread; a cancelled request (the client
    went away) leaves the queue and holds nothing, and its view never runs."""
    try:
        got = await lock.guard(mode).atry_acquire(timeout)
    except EngineUnavailable as exc:
        return unavailable(lock, exc)
    if _being_cancelled():
        # The request was cancelled while it waited, but the cancellation was swallowed on
        # the way (Python < 3.12's asyncio.wait_for, which redis-py's asyncio sends use, drops
        # one that lands as the awaited call completes), so the wait went on: the client is
        # gone, so give back what it got and end the request, as the cancellation meant.
        if got:
            await aleave(lock, mode)
        raise asyncio.CancelledError
    return None if got else _refusal(lock, mode, timeout, settings, retry, status, custom)


def _being_cancelled() -> bool:
    """True when the running task has a cancellation requested (Python 3.11+ can tell)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is not None and cancelling() > 0


def _refusal(lock: Target, mode: str, timeout: float | None, settings: WebSettings, retry: int | None,
             status: int | None, custom: bool) -> Refusal | LockTimeout:
    seconds = retry_after(timeout, retry if retry is not None else settings.retry_after)
    if isinstance(lock, Semaphore):     # a permit refused is "too many", not "locked"
        return limited(lock, seconds, status or LIMITED_STATUS)
    if custom:
        return LockTimeout(f"could not acquire the {mode} lock within {timeout} s", group=lock.group, name=lock.name)
    return busy(lock, mode, seconds, status or settings.locked_status)


def leave(lock: Target, mode: str) -> None:
    """Release a request's lock or permit; a lost lease or an unreachable engine is logged,
    never raised (the view has run; its answer stands)."""
    try:
        lock.guard(mode).release()
    except (LockLost, EngineUnavailable) as exc:
        _left_badly(lock, exc)


async def aleave(lock: Target, mode: str) -> None:
    """:func:`leave` for async views (the release completes even if the request is cancelled)."""
    try:
        await lock.guard(mode).arelease()
    except (LockLost, EngineUnavailable) as exc:
        _left_badly(lock, exc)


class RequestHold:
    """The hold of one request on its lock or permit, from before its view to after it: the
    one enter, run, leave sequence behind the decorators and per-user locks of both
    plugins, which only translate the refusal into their framework's response::

        with web.RequestHold(lock, mode, timeout, settings, owner=owner) as hold:
            if hold.refusal is not None:
                return answer(hold.refusal)
            return view()

    (``async with`` in async views). Entering acquires as ``owner`` (see :func:`enter`):
    ``refusal`` is then None (the view runs holding it) or what to answer instead, a
    :class:`Refusal` or, with ``custom``, the :class:`~ylock.LockTimeout` for the
    ON_LOCKED handler. Leaving releases quietly (:func:`leave`) unless refused, or calls
    ``release()`` instead (a release deferred to a transaction's commit). Where a
    framework splits the request into hooks, :meth:`enter` and :meth:`leave` are the two
    halves."""

    __slots__ = ("lock", "mode", "timeout", "settings", "retry", "status", "custom", "owner", "release",
                 "refusal", "_held")

    def __init__(self, lock: Target, mode: str, timeout: float | None, settings: WebSettings, *,
                 retry: int | None = None, status: int | None = None, custom: bool = False,
                 owner: str | None = None, release: Callable[[], None] | None = None) -> None:
        self.lock, self.mode, self.timeout, self.settings = lock, mode, timeout, settings
        self.retry, self.status, self.custom, self.owner, self.release = retry, status, custom, owner, release
        self.refusal: Refusal | LockTimeout | None = None
        self._held = False

    def _scope(self) -> Any:
        return owner_scope(self.owner) if self.owner is not None else contextlib.nullcontext()

    def enter(self) -> Refusal | LockTimeout | None:
        """Acquire; return (and keep in ``refusal``) what to answer instead, or None."""
        with self._scope():
            self.refusal = enter(self.lock, self.mode, self.timeout, self.settings, retry=self.retry,
                                 status=self.status, custom=self.custom)
        self._held = self.refusal is None
        return self.refusal

    def leave(self) -> None:
        """Release what :meth:`enter` took (nothing if it was refused; once)."""
        if not self._held:
            return
        self._held = False
        if self.release is not None:
            self.release()
            return
        with self._scope():
            leave(self.lock, self.mode)

    async def aenter(self) -> Refusal | LockTimeout | None:
        """:meth:`enter` for async views (see :func:`aenter`)."""
        with self._scope():
            self.refusal = await aenter(self.lock, self.mode, self.timeout, self.settings, retry=self.retry,
                                        status=self.status, custom=self.custom)
        self._held = self.refusal is None
        return self.refusal

    async def aleave(self) -> None:
        """:meth:`leave` for async views."""
        if not self._held:
            return
        self._held = False
        if self.release is not None:
            self.release()
            return
        with self._scope():
            await aleave(self.lock, self.mode)

    def __enter__(self) -> RequestHold:
        self.enter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave()

    async def __aenter__(self) -> RequestHold:
        await self.aenter()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aleave()


class Held:
    """What one request holds now, innermost last: the targets of its ``@locked`` and
    ``@limited`` decorators and of the per-user lock, each under the name its decorator
    or setting gave (the family: ``"accounts"``), while the view runs. Both plugins keep
    one per request and look it up for ``current_lock()``: the view reaches the lock the
    request holds (to pass ``lock.token`` to a fenced write) without rebuilding its name."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[tuple[str, Target]] = []

    def push(self, name: str, target: Target) -> None:
        """Record that the request now holds ``target`` of family ``name``."""
        self._held.append((name, target))

    def pop(self, target: Target) -> None:
        """Forget the innermost record of ``target`` (the request no longer holds it)."""
        for i in range(len(self._held) - 1, -1, -1):
            if self._held[i][1] is target:
                del self._held[i]
                return

    @contextlib.contextmanager
    def holding(self, name: str, target: Target) -> Iterator[None]:
        """Record ``target`` as held for the duration of the block."""
        self.push(name, target)
        try:
            yield
        finally:
            self.pop(target)

    def find(self, name: str | None = None) -> Target:
        """Return the innermost target held (of family ``name``, if given); raise LookupError
        saying what the request holds when there is none."""
        for held_name, target in reversed(self._held):
            if name is None or held_name == name:
                return target
        if not self._held:
            raise LookupError("this request holds no lock: current_lock() answers inside a view decorated with "
                              "@locked or @limited, or under the per-user lock (USER_LOCK), while the view runs")
        holds = ", ".join(repr(n) for n, _ in self._held)
        raise LookupError(f"this request holds no lock of {name!r}; it holds {holds} (the names given to "
                          "@locked, @limited or USER_LOCK['LOCK'])")


def _left_badly(lock: Target, exc: Exception) -> None:
    if isinstance(exc, LockLost):
        logger.error("ylock: %s", exc)
    else:
        logger.error("ylock: could not release %s/%s (its lease will expire): %s", lock.group, lock.name, exc)
