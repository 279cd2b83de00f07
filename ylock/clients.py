"""Who a web request is, for the per-user lock and for ``@locked``/``@limited`` views keyed
by the user (``key=None``): the one rule of both web plugins, which only read their own
request, user and session objects and call :func:`identify`.

In this order, the first that answers names the request's lock:

1. **a logged-in user** (Django's ``request.user``, Flask-Login's ``current_user``):
   ``user-<id>``, readable in ``ylock list``;
2. **the client's credential**, by the ``CLIENT_KEY`` function (default
   :func:`authorization`: the ``Authorization`` header, whatever its scheme: ``Bearer``,
   ``Token``, ``Basic``): ``client-<hmac>``, a keyed hash of it, so that a credential
   never sits in server keys, ``ylock list``, logs or 423 bodies. API clients (curl, a
   mobile app, another service) send no cookie: this is what tells two of them apart,
   and one of them from itself;
3. **the session the visitor already has** (``ANONYMOUS="session"``, the default): a
   server-side session's key, or the visitor id an earlier release of ylock kept in the
   session, as ``session-<hmac>``. Never a new session: reading one creates nothing
   (no row, no ``Set-Cookie``), and a request without a session cookie has none;
4. otherwise **no lock**: an anonymous request with nothing that identifies it is not
   serialised with anyone (locking it alone would serialise nothing, and a lock per
   request costs a round trip for no exclusion).

Why not a session for every cookie-less request, as before: each such request got a new
session (a database write and a ``Set-Cookie`` per request, never sent back by an API
client), hence a lock of its own, so two concurrent requests with the same token were
never serialised.

``CLIENT_KEY`` (Django: ``YLOCK["CLIENT_KEY"]``, Flask: ``YLOCK_CLIENT_KEY``) is a
function of the framework's request returning a str that identifies the client, or None;
what it returns is hashed into the name, so it may return a secret. :func:`header` reads
another header (an API key's); :func:`client_address` keys by the client's address (one
lock per address: everyone behind one NAT or proxy shares it). ``False`` turns step 2 off.
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any, TypeVar

from ylock import options as opt
from ylock.names import name_for

#: What a CLIENT_KEY function is: the framework's request -> an identity, or None.
ClientKey = Callable[[Any], "str | None"]

K = TypeVar("K", bound=Callable[..., Any])

#: The session key under which earlier releases kept an anonymous visitor's random id
#: (read, never written now).
SESSION_KEY = "_ylock_visitor"


def reads_request_only(key: K) -> K:
    """Mark a CLIENT_KEY function that only reads the request (no database, no I/O): an
    async view may call it in its event loop; any other runs in a thread there."""
    key.reads_request_only = True  # type: ignore[attr-defined]
    return key


def may_block(key: ClientKey) -> bool:
    """Whether ``key`` may do I/O (not marked by :func:`reads_request_only`)."""
    return not getattr(key, "reads_request_only", False)


@reads_request_only
def authorization(request: Any) -> str | None:
    """The default ``CLIENT_KEY``: the request's ``Authorization`` header (the credential
    with its scheme, e.g. ``Token 9944b0...``), or None. Django's ``request.headers`` and
    Flask's ``request.headers`` both read it."""
    return _header_value(request, "Authorization")


def header(name: str) -> ClientKey:
    """A ``CLIENT_KEY`` reading header ``name`` (e.g. ``header("X-Api-Key")``)."""
    opt.text(name, "header name", code=opt.E_USER_LOCK)

    def key(request: Any) -> str | None:
        return _header_value(request, name)
    key.__qualname__ = key.__name__ = f"header({name!r})"
    return reads_request_only(key)


@reads_request_only
def client_address(request: Any) -> str | None:
    """A ``CLIENT_KEY`` keying by the client's address (Flask's ``request.remote_addr``,
    Django's ``REMOTE_ADDR``): behind a proxy, the server must set it from the proxy's
    header (e.g. gunicorn's ``--forwarded-allow-ips``, Werkzeug's ``ProxyFix``)."""
    address = getattr(request, "remote_addr", None)
    if address is None:
        meta = getattr(request, "META", None)
        address = meta.get("REMOTE_ADDR") if isinstance(meta, dict) else None
    return address or None


def _header_value(request: Any, name: str) -> str | None:
    headers = getattr(request, "headers", None)
    value = headers.get(name) if headers is not None else None
    value = value.strip() if isinstance(value, str) else ""
    return value or None


def client_key_setting(value: Any, where: str) -> ClientKey | None:
    """Validate a ``CLIENT_KEY`` setting: None (the default, :func:`authorization`), False
    (no client key), a callable or the dotted path of one."""
    if value is None:
        return authorization
    if value is False:
        return None
    return opt.importable(value, where, code=opt.E_USER_LOCK, call=True)  # type: ignore[no-any-return]


# -- lock names ---------------------------------------------------------------------------------


def user_name(user_id: object) -> str:
    """The lock name of a logged-in user."""
    return name_for(f"user-{user_id}")


def client_name(value: str, secret: str | bytes | None) -> str:
    """The lock name of a client identified by ``value`` (a credential): a keyed hash of it."""
    return f"client-{_digest(b'ylock-client:', value, secret)}"


def session_name(session_id: str, secret: str | bytes | None) -> str:
    """The lock name of a visitor's session: a keyed hash of its id, so that the id (a
    credential) never appears where lock names are shown or stored."""
    return f"session-{_digest(b'ylock-session:', session_id, secret)}"


def _digest(domain: bytes, value: str, secret: str | bytes | None) -> str:
    # Keyed by the app's secret (Django's SECRET_KEY, Flask's secret_key), the same in every
    # process; without one, a plain hash: still no credential in the name.
    key = secret.encode() if isinstance(secret, str) else secret or b"ylock"
    return hmac.new(key, domain + value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:32]


def identify(*, user_id: object | None, client: Callable[[], str | None] | None,
             visitor: Callable[[], str | None] | None, secret: str | bytes | None) -> str | None:
    """Return the lock name of a request (see the module docstring), or None for no lock.

    ``user_id``: the logged-in user's id (None: anonymous); ``client()``: the CLIENT_KEY
    function's answer for the request (None: no key function); ``visitor()``: the id of
    the session the request came with, read without creating one (None: the session is
    not used, ``ANONYMOUS="skip"``). The callables run only when the steps before did not
    answer."""
    if user_id is not None:
        return user_name(user_id)
    credential = client() if client is not None else None
    if credential:
        return client_name(str(credential), secret)
    session_id = visitor() if visitor is not None else None
    if session_id:
        return session_name(str(session_id), secret)
    return None


__all__ = ["authorization", "header", "client_address", "client_key_setting", "reads_request_only", "may_block",
           "user_name", "client_name", "session_name", "identify", "SESSION_KEY", "ClientKey"]
