"""No engine's URL error shows the URL's password (issue #25, item 3): malformed URLs that
carry a password, fed to every engine's parser through ``ylock.engine_from_url``, fail with a
ConfigurationError (or build an engine) whose message, hint and repr never contain it."""
from __future__ import annotations

import pytest

import ylock

PASSWORD = "Pw-8c1f5e"     # nowhere else in these URLs, so any occurrence is a leak
SCHEMES = ["redis", "rediss", "redis+sentinel", "redis+cluster", "zookeeper", "postgresql", "local"]
# What comes after "scheme://user:PASSWORD@": no host, a bad port, an unclosed IPv6 bracket, an
# unknown option, options with bad values, an empty host list, a bad path.
TAILS = ["", "/", "/0", ":99999/0", "[::1/0", "host:1/0?bogus=1", "host:1/0?connect_timeout=abc",
         "host:1/0?connect_timeout=-1", ",/x", "host:notaport/x", "host:1/x?session_timeout=nan",
         "host:1/x?acl=everyone", "host:1/x?ca=/no/such/file", "host:1//x", "host:1/x?scope=nope"]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("tail", TAILS)
def test_no_url_error_shows_the_password(scheme: str, tail: str) -> None:
    url = f"{scheme}://user:{PASSWORD}@{tail}"
    try:
        engine = ylock.engine_from_url(url)
    except ylock.ConfigurationError as exc:
        for text in (str(exc), repr(exc), str(getattr(exc, "hint", "")), str(exc.__cause__ or "")):
            assert PASSWORD not in text, f"{scheme}: {text}"
    except (ValueError, TypeError) as exc:          # also refused: still no password
        assert PASSWORD not in str(exc) and PASSWORD not in repr(exc), f"{scheme}: {exc!r}"
    else:
        try:
            assert PASSWORD not in engine.url_for_display() and PASSWORD not in repr(engine)
        finally:
            engine.close()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_url_without_scheme_separator_hides_the_password_too(scheme: str) -> None:
    with pytest.raises(ylock.ConfigurationError) as refused:
        ylock.engine_from_url(f"{scheme}:/user:{PASSWORD}@host/0")
    assert PASSWORD not in str(refused.value)
