"""The ZooKeeper engine's URL and options (their grammar: :mod:`ylock.engines.zookeeper`),
checked once, when the engine is made, into :class:`Settings`.

Options that shape the connection (credentials now; ACLs and TLS would be more fields) are
parsed here and handed to the kazoo client by
:meth:`ylock.engines.zookeeper.session.Session._make_client`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from ylock import options as opt
from ylock.errors import ConfigurationError

#: The options a URL's query string may carry: name -> parser of the raw text.
URL_OPTIONS: dict[str, Callable[[str], Any]] = {"session_timeout": float, "connect_timeout": float,
                                                "root": str, "idle": float}

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

    def auth_data(self) -> list[tuple[str, str]] | None:
        """Return kazoo's ``auth_data`` for the URL's credentials (None without any)."""
        return [("digest", f"{self.auth.user}:{self.auth.password}")] if self.auth else None


def parse_url(url: str, *, session_timeout: float, connect_timeout: float, root: str, idle: float) -> Settings:
    """Return the Settings of ``url`` and the options; raise ConfigurationError naming the
    URL or the option that is wrong."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "zookeeper":
        raise ConfigurationError(f"not a ZooKeeper URL: {url!r}", code=opt.E_ENGINE_URL)
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts:
        raise ConfigurationError(f"ZooKeeper URL names no host: {url!r}", code=opt.E_ENGINE_URL)
    session = opt.seconds(session_timeout, f"{_WHERE} session_timeout", minimum=0.1, maximum=3600,
                          above=None, code=opt.E_ENGINE_URL)
    connect = opt.seconds(connect_timeout, f"{_WHERE} connect_timeout", maximum=3600, code=opt.E_ENGINE_URL)
    idle = opt.seconds(idle, f"{_WHERE} idle", maximum=86400, code=opt.E_ENGINE_URL)
    if not isinstance(root, str) or not root.startswith("/") or root.endswith("/") or "//" in root:
        raise ConfigurationError(f"{_WHERE} root must be an absolute znode path, got {root!r}",
                                 code=opt.E_ENGINE_URL)
    return Settings(
        url=url,
        hosts=hosts + (parts.path.rstrip("/") if parts.path not in ("", "/") else ""),
        auth=Credentials(unquote(parts.username or ""), unquote(parts.password or "")) if parts.username else None,
        session_timeout=session, connect_timeout=connect, root=root, idle=idle)


def check_option_names(options: dict[str, Any]) -> None:
    """Raise ConfigurationError naming any of ``options`` the engine does not take."""
    unknown = sorted(set(options) - set(URL_OPTIONS))
    if unknown:
        raise ConfigurationError(f"unknown ZooKeeper engine option{'s' if len(unknown) > 1 else ''} "
                                 f"{', '.join(unknown)}", code=opt.E_ENGINE_URL,
                                 hint=f"known: {', '.join(sorted(URL_OPTIONS))}")
