"""Lock waits and holds as OpenTelemetry spans (the SDK's in-memory exporter), and a
waiter's wait span linked to the hold span of the holder it waited for, across processes."""
from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import ylock
import ylock.tracing
from tests.helpers import Runner, wait_until
from ylock import events


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
    # The span's name is the group's (bounded: span metrics key by it); the lock's name an attribute.
    assert hold.name == f"ylock hold {group}" and wait.name == f"ylock wait {group}"
    assert hold.attributes["ylock.name"] == "n" and hold.attributes["ylock.token"] == token
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


# The holder, in a process of its own (argv: engine URL, group, "own span" or "no span"):
# traces with its own SDK provider and in-memory exporter, holds the lock inside a
# description of what it is doing (and inside a span of its own, or none), says "held" and
# its pid, releases when told, then prints its exported spans as JSON.
HOLDER = textwrap.dedent("""
    import json, os, sys, ylock, ylock.tracing
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ylock.tracing.enable(provider)
    url, group, case = sys.argv[1:]
    lock = ylock.Lock(ylock.engine_from_url(url), group, "n")

    def hold():
        with ylock.context("nightly export", batch=7):
            lock.lock()
        print("held", os.getpid(), flush=True)
        sys.stdin.readline()
        lock.unlock()

    if case == "own span":
        with provider.get_tracer("holder").start_as_current_span("holder's job"):
            hold()
    else:
        hold()
    print(json.dumps([{"name": s.name, "trace_id": s.context.trace_id, "span_id": s.context.span_id,
                       "parent": s.parent.span_id if s.parent else None, "start": s.start_time}
                      for s in exporter.get_finished_spans()]), flush=True)
""")


@pytest.fixture(params=["redis", "zookeeper", "postgres"])
def engine_url(request: pytest.FixtureRequest) -> str:
    """The URL of a server of each engine that two processes can share."""
    if request.param == "zookeeper":
        # The default session timeout (a holder process starting on a loaded machine keeps
        # its session; nothing here waits for one to expire).
        return request.getfixturevalue("zookeeper_server").url("/contract")  # type: ignore[no-any-return]
    return request.getfixturevalue(f"{request.param}_server").url  # type: ignore[no-any-return]


class _WaitBegins:
    """A watcher of the lock path that sets ``event`` when an acquisition begins to wait."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def on(self) -> bool:
        return True

    def start(self, acquisition: events.Acquisition) -> None:
        pass

    def waiting(self, acquisition: events.Acquisition) -> None:
        self.event.set()

    def waited(self, acquisition: events.Acquisition, token: int | None, error: BaseException | None) -> None:
        pass

    def held(self, acquisition: events.Acquisition, hold: object) -> None:
        pass

    def released(self, hold: object) -> None:
        pass


@pytest.mark.parametrize("case", ["no span", "own span"])
def test_the_wait_links_to_the_holders_hold_span_in_another_process(spans, engine_url, group, case, caplog) -> None:
    """A holder in another process, with no span of its own (a script, an untraced worker)
    or inside one: the waiter's wait span links to the holder's own ylock hold span (its
    trace and span ids, as the holder exported it), with what the holder said it was doing,
    its host, pid and since when as the link's attributes."""
    caplog.set_level(logging.DEBUG, logger="ylock.tracing")     # why a link is missing, if one is
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, engine_url, group, case],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    engine = ylock.engine_from_url(engine_url)
    try:
        said, pid = holder.stdout.readline().split()   # type: ignore[union-attr]
        assert said == "held"
        lock = ylock.Lock(engine, group, "n")

        def wait() -> dict:
            with lock.write(timeout=20):      # handed over by the holder's release (fair or not)
                return dict(engine.describe_lock(group, "n").context[ylock.current_owner()])

        # The holder may release once the waiter's wait has begun: tracing has read the
        # holders by then (it does so in its `waiting` hook, called before this watcher's).
        # "The waiter queued" alone is not enough: the node of its first try (without
        # waiting) is seen queued too, and a release right then left the wait, read after
        # it, nothing to link to (seen on a loaded machine).
        waiting = threading.Event()
        began = events.watch(_WaitBegins(waiting))
        try:
            waiter = Runner(wait)
            waiter.start()
            assert waiting.wait(20), "the waiter never began to wait"
        finally:
            events.unwatch(began)
        wait_until(lambda: any(i.waiters for i in engine.describe(group)), what="the waiter queued")
        holder.stdin.write("\n")   # type: ignore[union-attr]
        holder.stdin.flush()   # type: ignore[union-attr]
        waiter_said = waiter.outcome(20)
        exported = json.loads(holder.stdout.readline())   # type: ignore[union-attr]
    finally:
        holder.wait(20)
        engine.close()
    hold, = [s for s in exported if s["name"].startswith("ylock hold")]
    if case == "own span":
        own, = [s for s in exported if s["name"] == "holder's job"]
        assert hold["trace_id"] == own["trace_id"] and hold["parent"] == own["span_id"]
    else:
        assert hold["parent"] is None
    wait, = [s for s in named(spans, "ylock wait") if s.attributes["ylock.outcome"] == "acquired"]
    link, = wait.links
    assert (link.context.trace_id, link.context.span_id) == (hold["trace_id"], hold["span_id"])
    attributes = dict(link.attributes)
    assert attributes["ylock.holder"].split(":")[1] == pid
    assert attributes["ylock.holder.what"] == "nightly export" and attributes["ylock.holder.batch"] == 7
    assert attributes["ylock.holder.pid"] == int(pid) and attributes["ylock.holder.host"]
    assert abs(attributes["ylock.holder.since"] - hold["start"] / 1e9) < 5
    assert "ylock.holder.traceparent" not in attributes
    waiter_hold, = named(spans, "ylock hold")      # the waiter's own note names its hold span too
    assert waiter_said["traceparent"].split("-")[1:3] == [f"{waiter_hold.context.trace_id:032x}",
                                                          f"{waiter_hold.context.span_id:016x}"]


def test_a_semaphore_wait_links_to_the_hold_span_of_the_permit_holder(spans, redis_engine, group) -> None:
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with ylock.context("holds the only permit"), ylock.Semaphore(redis_engine, group, "s", permits=1).hold(5):
            holding.set()
            release.wait(10)

    holder = Runner(hold)
    holder.start()
    assert holding.wait(10)
    waiter = Runner(lambda: ylock.Semaphore(redis_engine, group, "s", permits=1).try_acquire(0.2))
    waiter.start()
    assert waiter.outcome() is False
    release.set()
    holder.outcome()
    hold_span, = named(spans, "ylock hold")
    wait, = [s for s in named(spans, "ylock wait") if s.attributes["ylock.outcome"] == "timed_out"]
    link, = wait.links
    assert (link.context.trace_id, link.context.span_id) == (hold_span.context.trace_id, hold_span.context.span_id)
    assert link.attributes["ylock.holder.what"] == "holds the only permit"


def test_the_hold_stores_its_own_span_first_whatever_else_it_says(spans, local_engine, group) -> None:
    """The ``traceparent`` a hold stores is its hold span's, and survives a description too
    long for the holder note (the rest is cut, not the link)."""
    lock = ylock.Lock(local_engine, group, "n")
    with ylock.context("x" * 190, more="y" * 190, still_more="z" * 190):
        with lock.write():
            info, = local_engine.describe(group)
    hold, = named(spans, "ylock hold")
    said = info.context[info.owners[0]]
    assert said["traceparent"] == f"00-{hold.context.trace_id:032x}-{hold.context.span_id:016x}-03"
    assert said["what"] == "x" * 190 and "still_more" not in said   # the note is bounded; the link kept


def test_an_asyncio_hold_stores_its_own_span(spans, local_engine, group) -> None:
    lock = ylock.Lock(local_engine, group, "n")

    async def hold() -> dict:
        async with lock.write():
            info, = local_engine.describe(group)
            return dict(info.context[info.owners[0]])

    said = asyncio.run(hold())
    hold_span, = named(spans, "ylock hold")
    assert said["traceparent"].split("-")[2] == f"{hold_span.context.span_id:016x}"


class NotTheSDK(trace.TracerProvider):
    """An OpenTelemetry implementation other than the SDK's: its tracer has no id generator."""

    def get_tracer(self, *args: object, **kwargs: object) -> trace.Tracer:
        return trace.NoOpTracer()


def test_a_tracer_that_cannot_be_given_ids_stores_no_traceparent(local_engine, group) -> None:
    """Holds are traced, their notes name no span (a link to a span that never exists would
    mislead), and the waits, unlinked, go on as ever."""
    ylock.tracing.enable(NotTheSDK())
    try:
        lock = ylock.Lock(local_engine, group, "n")
        with ylock.context("job"), lock.write():
            info, = local_engine.describe(group)
            waiter = Runner(lambda: ylock.Lock(local_engine, group, "n").try_lock(0.05))
            waiter.start()
            assert waiter.outcome() is False
        assert dict(info.context[info.owners[0]]).keys() == {"what", "host", "pid", "since"}
    finally:
        ylock.tracing.disable()


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


def _contended_commands(engine: ylock.Engine, admin: redis.Redis, group: str, name: str) -> dict[str, int]:
    """The server's commands (by name; those run inside scripts counted too) for one round: a
    holder's uncontended pair, and a waiter that queues behind it and is handed the lock. The
    test's own probes (LLEN of the queue, INFO) are left out."""
    holder, waiter = ylock.Lock(engine, group, name), ylock.Lock(engine, group, name)
    holder.lock()
    before = admin.info("commandstats")
    runner = Runner(lambda: waiter.lock(timeout=10) or waiter.unlock())
    runner.start()
    probes: list[int] = []                                   # one LLEN per look
    wait_until(lambda: probes.append(1) or admin.llen(f"ylock:{{{group}:{name}}}:q"), what="the waiter queued")
    holder.unlock()
    runner.outcome()
    after = admin.info("commandstats")
    out = {k[len("cmdstat_"):]: v["calls"] - before.get(k, {"calls": 0})["calls"] for k, v in after.items()
           if not k.startswith(("cmdstat_info", "cmdstat_config"))}
    out["llen"] -= len(probes)
    return {k: v for k, v in out.items() if v}


def test_a_traced_wait_costs_no_request_of_its_own(redis_server, redis_engine, group) -> None:
    """With tracing on, a contended acquisition sends the requests an untraced one sends: the
    engine says when it queues, and the try that queued it brought the holder's note (its
    hold span's traceparent), so no second try and no read of the holders. The wait still
    links to the holder's hold span; the script reads the note on the server (a few commands
    inside the one script call)."""
    admin = redis.Redis.from_url(redis_server.url)
    _contended_commands(redis_engine, admin, group, "warm")      # the scripts loaded, the connections made
    off = _contended_commands(redis_engine, admin, group, "off")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ylock.tracing.enable(provider)
    try:
        on = _contended_commands(redis_engine, admin, group, "on")
    finally:
        ylock.tracing.disable()
    requests = ("evalsha", "blpop", "lpush")               # what the client sends itself
    assert {k: on.get(k, 0) for k in requests} == {k: off.get(k, 0) for k in requests}, (off, on)
    assert sum(on.values()) - sum(off.values()) <= 3, (off, on)   # ZRANGEBYSCORE and GET of the note
    spans = [s for s in exporter.get_finished_spans() if s.attributes["ylock.name"] == "on"]
    hold = next(s for s in spans if s.name == f"ylock hold {group}")
    wait = [s for s in spans if s.name == f"ylock wait {group}" and s.links]
    assert len(wait) == 1 and wait[0].links[0].context.span_id == hold.context.span_id


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
        said, = [c for i in engine.describe(sys.argv[2]) for c in i.context.values()]
    print("spans", sorted(s.name.split()[1] for s in exporter.get_finished_spans()))
    hold, = [s for s in exporter.get_finished_spans() if s.name.startswith("ylock hold")]
    print("stored its hold span", said["traceparent"].split("-")[2] == format(hold.context.span_id, "016x"))
""")


def test_enabled_before_a_provider_is_configured_costs_nothing_until_one_is(redis_server, group) -> None:
    """``enable()`` while OpenTelemetry has no provider: acquisitions go the untraced way (no
    read of the holders for links, no spans); once the application sets a provider, the next
    acquisition is traced, its hold storing its hold span's ids (in a child process: the
    global provider can be set once)."""
    done = subprocess.run([sys.executable, "-c", GLOBAL_PROVIDER, redis_server.url, group], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["untraced 0", "spans ['hold', 'wait']", "stored its hold span True"], \
        done.stdout
