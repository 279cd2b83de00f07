"""The core imports no framework (STYLE: framework-free core); bad engine URLs and options are
ConfigurationErrors that name the problem, raised before any connection."""
import subprocess
import sys

import pytest

import ylock


def test_import_ylock_pulls_in_no_framework() -> None:
    code = ("import sys, ylock, ylock.engines.local, ylock.engines.redis, ylock.watchdog; "
            "bad = sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('django', 'flask', 'blinker', 'click', 'celery', 'kombu')); "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("url, options, message", [
    ("mysql://x", {}, "unknown engine URL scheme 'mysql'"),
    ("127.0.0.1:6379", {}, "scheme://"),
    ("redis://127.0.0.1/0?socket_timeout=abc", {}, "socket_timeout"),
    # Options neither ylock nor redis-py takes fail when the engine is made, naming them,
    # not with a TypeError from inside redis-py on the first lock call.
    ("redis://127.0.0.1/0?bogus=1", {}, "unknown Redis URL option bogus"),
    ("redis://127.0.0.1/0?ssl_ca_certs=/tmp/ca.crt", {}, "TLS options need a rediss:// URL"),
    ("redis+cluster://127.0.0.1:7000?ssl=true", {}, "redis[+]cluster:// URL options are ylock's only"),
])
def test_bad_urls_and_options_are_configuration_errors(url: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(ylock.ConfigurationError, match=message):
        ylock.engine_from_url(url, **options)


@pytest.mark.parametrize("url, message", [
    # keyword options are checked when the client is built, still before any connection
    ("redis://127.0.0.1:1/0", "unexpected keyword argument 'bogus'"),
    ("redis+sentinel://127.0.0.1:1/mymaster", "unexpected keyword argument 'bogus'"),
])
def test_bad_keyword_options_fail_before_connecting(url: str, message: str) -> None:
    engine = ylock.engine_from_url(url, bogus=1)
    with pytest.raises(ylock.ConfigurationError, match=message):
        engine.check_options()
    with pytest.raises(ylock.ConfigurationError, match=message):
        engine.ping()


def test_urls_and_paths_that_are_fine() -> None:
    tls = ylock.engine_from_url("rediss://127.0.0.1:1/0?ssl_ca_certs=/tmp/ca.crt&client_name=a&socket_keepalive=true")
    tls.check_options()                                      # redis-py's own options pass
    with pytest.raises(ylock.ConfigurationError, match="master name"):
        ylock.engine_from_url("redis+sentinel://127.0.0.1:26379").ping()
    with pytest.raises(ylock.ConfigurationError, match="cannot be imported"):
        ylock.engine_from_path("nope.Engine")
    assert isinstance(ylock.engine_from_path("ylock.engines.local.LocalEngine"), ylock.Engine)
    engine = ylock.engine_from_url("redis://user:secret@127.0.0.1:1/0?prefix=app")
    assert "secret" not in repr(engine) and engine.prefix == "app"  # type: ignore[attr-defined]


def test_the_errors_are_also_builtin_exceptions() -> None:
    assert isinstance(ylock.LockTimeout("x"), TimeoutError)
    assert isinstance(ylock.EngineUnavailable("x"), ConnectionError)
    assert isinstance(ylock.ConfigurationError("x"), ValueError)
