"""Lock waits and holds as OpenTelemetry spans (the SDK's in-memory exporter), and a
waiter's wait span linked to the span of the holder it waited for, across processes."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import ylock
import ylock.tracing
from tests.helpers import Runner, wait_until


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ylock.tracing.enable(provider)
    try:
        yield exporter
    finally:
        ylock.tracing.disable()


def named(exporter: InMemorySpanExporter, prefix: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def test_a_hold_is_one_span_across_reentry_and_a_wait_another(spans, redis_engine, group) -> None:
    lock = ylock.Lock(redis_engine, group, "n")
    with lock.write(timeout=5):
        with lock.write(timeout=5):
            token = lock.token
        assert named(spans, "ylock hold") == []        # re-entry does not end it
    hold, = named(spans, "ylock hold")
    wait, = named(spans, "ylock wait")
    assert hold.name == f"ylock hold {group}/n" and hold.attributes["ylock.token"] == token
    assert hold.attributes["ylock.mode"] == "write" and hold.attributes["ylock.engine"] == "redis"
    assert wait.attributes["ylock.outcome"] == "acquired" and wait.status.status_code != StatusCode.ERROR
    assert wait.end_time <= hold.start_time + 5_000_000


def test_a_timeout_is_an_error_status(spans, redis_engine, group) -> None:
    holder = ylock.Lock(redis_engine, group, "n")
    holder.lock()
    try:
        runner = Runner(lambda: ylock.Lock(redis_engine, group, "n").try_lock(0.2))
        runner.start()
        assert runner.outcome() is False
    finally:
        holder.unlock()
    waits = [s for s in named(spans, "ylock wait") if s.attributes["ylock.outcome"] == "timed_out"]
    assert waits and waits[0].status.status_code == StatusCode.ERROR


def test_a_lost_hold_ends_its_span_in_error(spans, redis_engine, group) -> None:
    lock = ylock.Lock(redis_engine, group, "n", lease=0.9)
    lock.lock()
    redis_engine.force_release(group, "n")
    wait_until(lambda: lock.lost, what="the loss reported")
    with pytest.raises(ylock.LockLost):
        lock.unlock()
    hold, = named(spans, "ylock hold")
    assert hold.status.status_code == StatusCode.ERROR
    assert [e.name for e in hold.events] == ["ylock.lost"]


def test_the_wait_links_to_the_holder_in_another_process(spans, redis_server, group) -> None:
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, ylock, ylock.tracing
        from opentelemetry.sdk.trace import TracerProvider
        provider = TracerProvider()
        ylock.tracing.enable(provider)
        tracer = provider.get_tracer("holder")
        lock = ylock.Lock(ylock.engine_from_url({redis_server.url!r}), {group!r}, "n")
        with tracer.start_as_current_span("holder's request") as span:
            lock.lock()
            print(format(span.get_span_context().span_id, "016x"), flush=True)
            sys.stdin.readline()
            lock.unlock()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        holder_span = holder.stdout.readline().strip()
        assert len(holder_span) == 16
        engine = ylock.engine_from_url(redis_server.url)
        waiter = Runner(lambda: ylock.Lock(engine, group, "n").lock(timeout=20))
        waiter.start()
        wait_until(lambda: any(i.waiters for i in engine.describe(group)), what="the waiter queued")
        holder.stdin.write("\n")
        holder.stdin.flush()
        waiter.outcome(20)
    finally:
        holder.wait(10)
    wait, = [s for s in named(spans, "ylock wait") if s.attributes["ylock.outcome"] == "acquired"]
    assert [format(link.context.span_id, "016x") for link in wait.links] == [holder_span]


def test_no_tracing_no_spans_and_no_extra_round_trip(redis_engine, group) -> None:
    assert ylock.tracing.ACTIVE is None
    calls: list[object] = []
    original = redis_engine.describe_lock
    redis_engine.describe_lock = lambda *a, **k: calls.append(a) or original(*a, **k)  # type: ignore[method-assign]
    holder = ylock.Lock(redis_engine, group, "n")
    holder.lock()
    runner = Runner(lambda: ylock.Lock(redis_engine, group, "n").try_lock(0.1))
    runner.start()
    assert runner.outcome() is False
    holder.unlock()
    assert calls == []


GLOBAL_PROVIDER = textwrap.dedent("""
    import sys
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    import ylock, ylock.tracing

    engine = ylock.engine_from_url(sys.argv[1])
    calls = []
    original = engine.describe_lock
    engine.describe_lock = lambda *a, **k: calls.append(a) or original(*a, **k)
    ylock.tracing.enable()                       # no provider configured yet: the API's proxy
    holder = ylock.Lock(engine, sys.argv[2], "n")
    holder.lock()
    waiter = ylock.Lock(engine, sys.argv[2], "n")
    import threading
    t = threading.Thread(target=lambda: waiter.try_lock(0.1)); t.start(); t.join()
    holder.unlock()
    print("untraced", len(calls))                # no holders read for links: the untraced path
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)          # the application configures OpenTelemetry later
    with holder.write():
        pass
    print("spans", sorted(s.name.split()[1] for s in exporter.get_finished_spans()))
""")


def test_enabled_before_a_provider_is_configured_costs_nothing_until_one_is(redis_server, group) -> None:
    """``enable()`` while OpenTelemetry has no provider: acquisitions go the untraced way (no
    read of the holders for links, no spans); once the application sets a provider, the next
    acquisition is traced (in a child process: the global provider can be set once)."""
    done = subprocess.run([sys.executable, "-c", GLOBAL_PROVIDER, redis_server.url, group], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["untraced 0", "spans ['hold', 'wait']"], done.stdout
