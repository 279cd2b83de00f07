"""The ZooKeeper engine's URL and options (their grammar: :mod:`ylock.engines.zookeeper`),
checked once, when the engine is made, into :class:`Settings`.

Options that shape the connection (credentials, the ACL of the nodes ylock creates, TLS)
are parsed here and handed to the kazoo client by
:meth:`ylock.engines.zookeeper.session.Session._make_client`. Every message that quotes the
URL quotes it redacted (no password).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from kazoo.security import ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, make_digest_acl

from ylock import options as opt
from ylock.engines.base import parse_bool
from ylock.engines.zookeeper.guard import SUSPENDED_MODES
from ylock.errors import ConfigurationError

#: The options a URL's query string may carry: name -> parser of the raw text.
URL_OPTIONS: dict[str, Callable[[str], Any]] = {"session_timeout": float, "connect_timeout": float,
                                                "root": str, "idle": float, "suspended": str,
                                                "lost_after": float, "acl": str, "tls": parse_bool, "ca": str,
                                                "certfile": str, "keyfile": str, "verify_certs": parse_bool,
                                                "check_hostname": parse_bool}

#: The ``acl`` option: who may do what with the nodes ylock creates (with credentials).
ACL_MODES = ("creator", "read", "open")


_WHERE = "ZooKeeper engine option"


class Credentials(NamedTuple):
    """A user and password for kazoo's ``digest`` auth."""

    user: str
    password: str


@dataclass(frozen=True)
class Settings:
    """A ZooKeeper engine's checked URL and options."""

    url: str
    hosts: str                      # "h1:2181,h2:2181[/chroot]", as kazoo takes it
    auth: Credentials | None        # for digest auth, from the URL
    session_timeout: float
    connect_timeout: float
    root: str
    idle: float
    suspended: str                  # what a suspended connection means (guard.py): guard, lost, wait
    lost_after: float               # the guard's fraction of the negotiated session timeout
    acl: str                        # one of ACL_MODES
    tls: bool
    ca: str | None                  # CA bundle that signs the servers' certificates
    certfile: str | None            # client certificate (mutual TLS)
    keyfile: str | None             # its key
    verify_certs: bool
    check_hostname: bool

    def default_acl(self) -> list[ACL]:
        """Return the ACL of every node ylock creates.

        ``creator``: only clients authenticated with the URL's user and password may do
        anything with them; ``read``: the same, and anyone may also read them (list locks
        and waiters, read a holder's node) but change nothing; ``open``: anyone may do
        anything. The owner is the digest identity alone (not kazoo's ``auth`` scheme,
        which would also grant a mutual-TLS client's certificate identity: every client
        sharing that certificate would own the nodes)."""
        if self.acl == "open" or self.auth is None:
            return list(OPEN_ACL_UNSAFE)
        owner = make_digest_acl(self.auth.user, self.auth.password, all=True)
        return [owner] + (list(READ_ACL_UNSAFE) if self.acl == "read" else [])

    def tls_options(self) -> dict[str, Any]:
        """Return kazoo's TLS keyword arguments ({} without TLS)."""
        if not self.tls:
            return {}
        return {"use_ssl": True, "ca": self.ca, "certfile": self.certfile, "keyfile": self.keyfile,
                "verify_certs": self.verify_certs, "check_hostname": self.check_hostname}

    def auth_data(self) -> list[tuple[str, str]] | None:
        """Return kazoo's ``auth_data`` for the URL's credentials (None without any)."""
        return [("digest", f"{self.auth.user}:{self.auth.password}")] if self.auth else None


def parse_url(url: str, *, session_timeout: float, connect_timeout: float, root: str, idle: float,
              suspended: str = "guard", lost_after: float = 0.5, acl: str | None = None, tls: bool | None = None,
              ca: str | None = None, certfile: str | None = None, keyfile: str | None = None,
              verify_certs: bool = True, check_hostname: bool | None = None) -> Settings:
    """Return the Settings of ``url`` and the options; raise ConfigurationError naming the
    URL (redacted) or the option that is wrong."""
    from ylock.engines import redact  # ylock.engines imports the engines' packages lazily
    try:
        parts = urlsplit(url)
        username, password = parts.username, parts.password
    except ValueError as exc:
        raise ConfigurationError(f"ZooKeeper URL {redact(url)!r} is malformed: {exc}", code=opt.E_ENGINE_URL) \
            from None
    if parts.scheme.lower() != "zookeeper":
        raise ConfigurationError(f"not a ZooKeeper URL: {redact(url)!r}", code=opt.E_ENGINE_URL)
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts:
        raise ConfigurationError(f"ZooKeeper URL names no host: {redact(url)!r}", code=opt.E_ENGINE_URL)
    session = opt.seconds(session_timeout, f"{_WHERE} session_timeout", minimum=0.1, maximum=3600,
                          above=None, code=opt.E_ENGINE_URL)
    connect = opt.seconds(connect_timeout, f"{_WHERE} connect_timeout", maximum=3600, code=opt.E_ENGINE_URL)
    idle = opt.seconds(idle, f"{_WHERE} idle", maximum=86400, code=opt.E_ENGINE_URL)
    suspended = opt.choice(suspended, f"{_WHERE} suspended", SUSPENDED_MODES, code=opt.E_ENGINE_URL)
    # Above 1/2 the guard could be late (see guard.py); a smaller fraction only warns earlier.
    lost_after = opt.number(lost_after, f"{_WHERE} lost_after", minimum=0.05, maximum=0.5, code=opt.E_ENGINE_URL)
    if not isinstance(root, str) or not root.startswith("/") or root.endswith("/") or "//" in root:
        raise ConfigurationError(f"{_WHERE} root must be an absolute znode path, got {root!r}",
                                 code=opt.E_ENGINE_URL)
    auth = Credentials(unquote(username or ""), unquote(password or "")) if username else None
    if acl is None:
        acl = "creator" if auth else "open"
    acl = opt.choice(acl, f"{_WHERE} acl", ACL_MODES, code=opt.E_ENGINE_URL)
    if acl != "open" and auth is None:
        raise ConfigurationError(f"{_WHERE} acl={acl} needs credentials in the URL "
                                 "(zookeeper://user:password@host/...): the ACL names the user", code=opt.E_ENGINE_URL)
    files = {}
    for name, path in (("ca", ca), ("certfile", certfile), ("keyfile", keyfile)):
        if path is not None:
            path = opt.text(path, f"{_WHERE} {name}", code=opt.E_ENGINE_URL)
            if not os.path.isfile(path):
                raise ConfigurationError(f"{_WHERE} {name}: no such file {path!r}", code=opt.E_ENGINE_URL)
        files[name] = path
    if tls is None:
        tls = any(files.values())        # a CA or a client certificate means TLS
    tls = opt.boolean(tls, f"{_WHERE} tls", code=opt.E_ENGINE_URL)
    verify_certs = opt.boolean(verify_certs, f"{_WHERE} verify_certs", code=opt.E_ENGINE_URL)
    if not tls and any(files.values()):
        raise ConfigurationError(f"{_WHERE} ca, certfile and keyfile need tls=1, got tls=0", code=opt.E_ENGINE_URL)
    if bool(files["keyfile"]) != bool(files["certfile"]):
        # kazoo loads a client certificate only with both (a combined PEM alone is ignored).
        raise ConfigurationError(f"{_WHERE} certfile and keyfile go together (the client certificate and its key)",
                                 code=opt.E_ENGINE_URL)
    # The server's name is checked against its certificate unless certificates are not checked
    # at all (kazoo's own default is not to check it).
    check_hostname = opt.boolean(verify_certs if check_hostname is None else check_hostname,
                                 f"{_WHERE} check_hostname", code=opt.E_ENGINE_URL)
    if check_hostname and not verify_certs:
        raise ConfigurationError(f"{_WHERE} check_hostname=1 needs verify_certs=1", code=opt.E_ENGINE_URL)
    return Settings(
        url=url,
        hosts=hosts + (parts.path.rstrip("/") if parts.path not in ("", "/") else ""),
        auth=auth, session_timeout=session, connect_timeout=connect, root=root, idle=idle, suspended=suspended,
        lost_after=float(lost_after), acl=acl, tls=tls, ca=files["ca"], certfile=files["certfile"],
        keyfile=files["keyfile"], verify_certs=verify_certs, check_hostname=check_hostname)


def check_option_names(options: dict[str, Any]) -> None:
    """Raise ConfigurationError naming any of ``options`` the engine does not take."""
    unknown = sorted(set(options) - set(URL_OPTIONS))
    if unknown:
        raise ConfigurationError(f"unknown ZooKeeper engine option{'s' if len(unknown) > 1 else ''} "
                                 f"{', '.join(unknown)}", code=opt.E_ENGINE_URL,
                                 hint=f"known: {', '.join(sorted(URL_OPTIONS))}")
