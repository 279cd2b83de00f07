"""The core never imports Django or Flask (STYLE: framework-free core)."""
import subprocess
import sys


def test_import_ylock_pulls_in_no_framework() -> None:
    code = ("import sys, ylock, ylock.engines.local, ylock.engines.redis, ylock.watchdog; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'flask', 'blinker', 'click')); "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_unknown_scheme_and_bad_urls_are_configuration_errors() -> None:
    import pytest

    import ylock
    with pytest.raises(ylock.ConfigurationError, match="unknown engine URL scheme 'mysql'"):
        ylock.engine_from_url("mysql://x")
    with pytest.raises(ylock.ConfigurationError, match="scheme://"):
        ylock.engine_from_url("127.0.0.1:6379")
    with pytest.raises(ylock.ConfigurationError, match="socket_timeout"):
        ylock.engine_from_url("redis://127.0.0.1/0?socket_timeout=abc")
    # Options neither ylock nor redis-py takes fail when the engine is made, naming them,
    # not with a TypeError from inside redis-py on the first lock call.
    with pytest.raises(ylock.ConfigurationError, match="unknown Redis URL option bogus"):
        ylock.engine_from_url("redis://127.0.0.1/0?bogus=1")
    with pytest.raises(ylock.ConfigurationError, match="TLS options need a rediss:// URL"):
        ylock.engine_from_url("redis://127.0.0.1/0?ssl_ca_certs=/tmp/ca.crt")
    with pytest.raises(ylock.ConfigurationError, match="redis[+]cluster:// URL options are ylock's only"):
        ylock.engine_from_url("redis+cluster://127.0.0.1:7000?ssl=true")
    with pytest.raises(ylock.ConfigurationError, match="unexpected keyword argument 'bogus'"):
        ylock.engine_from_url("redis://127.0.0.1:1/0", bogus=1).ping()
    with pytest.raises(ylock.ConfigurationError, match="unexpected keyword argument 'bogus'"):
        ylock.engine_from_url("redis+sentinel://127.0.0.1:1/mymaster", bogus=1).ping()
    with pytest.raises(ylock.ConfigurationError, match="unknown ZooKeeper engine option bogus"):
        ylock.engine_from_url("zookeeper://127.0.0.1:2181/x", bogus=1)
    tls = ylock.engine_from_url("rediss://127.0.0.1:1/0?ssl_ca_certs=/tmp/ca.crt&client_name=a&socket_keepalive=true")
    assert tls.prefix == "ylock"  # type: ignore[attr-defined]   # redis-py's own options pass
    with pytest.raises(ylock.ConfigurationError, match="master name"):
        ylock.engine_from_url("redis+sentinel://127.0.0.1:26379").ping()
    with pytest.raises(ylock.ConfigurationError, match="cannot import engine"):
        ylock.engine_from_path("nope.Engine")
    assert isinstance(ylock.engine_from_path("ylock.engines.local.LocalEngine"), ylock.Engine)
    engine = ylock.engine_from_url("redis://user:secret@127.0.0.1:1/0?prefix=app")
    assert "secret" not in repr(engine) and engine.prefix == "app"  # type: ignore[attr-defined]
    assert isinstance(ylock.LockTimeout("x"), TimeoutError)
    assert isinstance(ylock.EngineUnavailable("x"), ConnectionError)
    assert isinstance(ylock.ConfigurationError("x"), ValueError)
