"""The InfluxDB exporter against a real server speaking InfluxDB's v2 write API
(VictoriaMetrics): points read back with their tags and values; lock calls unaffected
when the server is down or swallows requests; the buffer stays bounded; drops counted."""
from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

import pytest

import ylock
import ylock.metrics
from tests.helpers import Runner, collect, wait_until
from tests.metrics.conftest import Blackhole
from ylock.testing import free_port
from ylock.testing.victoriametrics import VictoriaMetrics


def influx(url: str, **extra: Any) -> dict[str, Any]:
    return {"URL": url, "TOKEN": "any-token", "ORG": "acme", "BUCKET": "locks", **extra}


def by_name(series: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """Index exported series by (metric, outcome, mode)."""
    out: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for s in series:
        m = s["metric"]
        out.setdefault((m["__name__"], m["outcome"], m["mode"]), []).append(s)
    return out


def test_points_read_back_with_their_tags_and_values(victoria_metrics: VictoriaMetrics, group: str) -> None:
    metrics = ylock.metrics.configure({"INFLUXDB": influx(victoria_metrics.url, TAGS={"host": "web-1"}),
                                       "TAG_NAMES": [group]})       # this group's names are few: tag them
    engine = ylock.engine_from_url("local://")
    lock = ylock.Lock(engine, group, "invoice-7")
    with collect() as seen:
        with lock.write():
            # A contender times out while we hold: a timed_out event with its wait span.
            contender = Runner(lambda: ylock.Lock(engine, group, "invoice-7").try_lock(0.05))
            contender.start()
            assert contender.outcome() is False
        with lock.read():
            pass
    assert metrics.flush(10)
    seen = [e for e in seen if e.group == group]
    assert metrics.influxdb.stats()["shipped"] >= len(seen) == 5

    # count per event, wait on acquired/timed_out, hold and release on released: 5 + 3 + 2 + 2
    series = by_name(victoria_metrics.export(f'{{__name__=~"ylock_.*", group="{group}"}}', samples=12))
    for s in (x for xs in series.values() for x in xs):
        labels = s["metric"]
        assert labels["group"] == group and labels["name"] == "invoice-7"
        assert labels["engine"] == "local" and labels["host"] == "web-1"
    assert sum(sum(s["values"]) for s in series[("ylock_count", "acquired", "write")]) == 1
    assert sum(sum(s["values"]) for s in series[("ylock_count", "acquired", "read")]) == 1
    assert sum(sum(s["values"]) for s in series[("ylock_count", "released", "write")]) == 1
    assert sum(sum(s["values"]) for s in series[("ylock_count", "timed_out", "write")]) == 1

    timed_out = next(e for e in seen if e.kind == "timed_out")
    [wait] = series[("ylock_wait", "timed_out", "write")]
    assert wait["values"] == [pytest.approx(timed_out.wait, rel=1e-6)] and wait["values"][0] >= 0.05
    assert wait["timestamps"] == [int(timed_out.timestamp * 1000)]

    released = next(e for e in seen if e.kind == "released" and e.mode == "write")
    [hold] = series[("ylock_hold", "released", "write")]
    assert hold["values"] == [pytest.approx(released.hold, rel=1e-6)] and hold["values"][0] >= 0.05
    [release] = series[("ylock_release", "released", "write")]
    assert release["values"] == [pytest.approx(released.release, rel=1e-6)]


def test_lock_names_are_tags_only_where_opted_in(victoria_metrics: VictoriaMetrics, group: str) -> None:
    """The same rule as Prometheus's labels: a tag set is a series, so names are tags only in
    the groups TAG_NAMES lists (a per-user family: by default, ``name="*"``)."""
    users = group + "u"
    metrics = ylock.metrics.configure({"INFLUXDB": influx(victoria_metrics.url, MEASUREMENT="locks"),
                                       "TAG_NAMES": [group]})
    engine = ylock.engine_from_url("local://")
    for i in range(20):
        with ylock.Locks(engine, users).write(f"user-{i}"):
            pass
    with ylock.Lock(engine, group, "global"):
        pass
    assert metrics.flush(10)
    per_user = victoria_metrics.export(f'{{__name__="locks_count", group="{users}"}}', samples=40)
    assert {s["metric"]["name"] for s in per_user} == {"*"}     # 2 series, not 40
    assert len(per_user) == 2
    named = victoria_metrics.export(f'{{__name__="locks_count", group="{group}"}}', samples=2)
    assert {s["metric"]["name"] for s in named} == {"global"}


def test_settings_come_from_the_environment(victoria_metrics: VictoriaMetrics, group: str) -> None:
    environ = {"INFLUXDB_URL": victoria_metrics.url, "INFLUXDB_TOKEN": "t", "INFLUXDB_ORG": "o",
               "INFLUXDB_BUCKET": "b"}
    metrics = ylock.metrics.configure({"INFLUXDB": True, "TAG_NAMES": False}, environ=environ)
    assert metrics.influxdb.url == victoria_metrics.url and metrics.influxdb.bucket == "b"
    with ylock.Lock(ylock.engine_from_url("local://"), group, "x"):
        pass
    assert metrics.flush(10)
    [acquired] = victoria_metrics.export(f'{{__name__="ylock_count", group="{group}", outcome="acquired"}}',
                                         samples=1)
    assert acquired["metric"]["name"] == "*"


def test_one_writer_per_process_for_the_same_settings(victoria_metrics: VictoriaMetrics) -> None:
    first = ylock.metrics.configure({"INFLUXDB": influx(victoria_metrics.url)})
    second = ylock.metrics.configure({"INFLUXDB": influx(victoria_metrics.url)})
    assert first.influxdb is second.influxdb
    assert ylock.events._subscribers.count(first.influxdb) == 1


def lock_cycles(engine: ylock.Engine, group: str, n: int, observe: Any = None) -> list[float]:
    """Take and release a lock ``n`` times; return each cycle's duration."""
    lock = ylock.Lock(engine, group, "hot")
    durations = []
    for _ in range(n):
        started = time.perf_counter()
        with lock:
            pass
        durations.append(time.perf_counter() - started)
        if observe is not None:
            observe()
    return durations


def test_a_blackholed_server_costs_lock_calls_nothing(blackhole: Blackhole, victoria_metrics: VictoriaMetrics,
                                                      group: str) -> None:
    metrics = ylock.metrics.configure({"INFLUXDB": influx(blackhole.url, BUFFER_SIZE=100, BATCH_SIZE=10,
                                                          FLUSH_INTERVAL=0.05, TIMEOUT=1.0, RETRIES=0)})
    exporter = metrics.influxdb
    engine = ylock.engine_from_url("local://")
    queued: list[int] = []
    with collect() as seen:
        durations = lock_cycles(engine, group, 1000, lambda: queued.append(exporter.stats()["queued"]))
    wait_until(lambda: blackhole.accepted >= 1, what="the exporter to connect to the blackhole")
    # Every call finished at local-engine speed although the writer hangs on a request
    # for a whole second: nothing on the lock path waits for the exporter.
    assert max(durations) < 0.25, max(durations)
    assert max(queued) <= 100
    stats = exporter.stats()
    assert stats["dropped"] >= len(seen) - 100 - 10 > 0
    assert stats["shipped"] == 0

    # The drop count is visible where operators look: stats() and the Prometheus collector.
    # It may still grow meanwhile (the buffer is full, and other tests' leftover holds renew
    # in this process), so each is read between two readings of the exporter's own count.
    before = exporter.stats()["dropped"]
    shown = ylock.metrics.stats()["exporters"]["influxdb"]["dropped"]
    assert before <= shown <= exporter.stats()["dropped"], (before, shown)
    from ylock.metrics.prometheus import PrometheusExporter
    before = exporter.stats()["dropped"]
    text = PrometheusExporter().expose()[0].decode()
    after = exporter.stats()["dropped"]
    exposed = re.search(r'^ylock_exporter_dropped_total\{exporter="influxdb"\} (\S+)$', text, re.M)
    assert exposed is not None and before <= float(exposed.group(1)) <= after, (before, exposed, after)

    # Once the server answers again, the exporter recovers by itself.
    blackhole.swallow = False
    wait_until(lambda: exporter.stats()["failed_batches"] >= 1, timeout=10, what="the hung write to time out")
    assert "Timeout" in (exporter.stats()["last_error"] or "") or "timed out" in exporter.stats()["last_error"]
    # After a back-off it ships what it buffered, with nobody asking.
    wait_until(lambda: exporter.stats()["shipped"] > 0 and exporter.stats()["queued"] == 0, timeout=10,
               what="the buffered events to be shipped")
    recovered = group + "r"
    with ylock.Lock(engine, recovered, "after"):
        pass
    assert metrics.flush(10)
    victoria_metrics.export(f'{{__name__="ylock_count", group="{recovered}"}}', samples=2)
    total = exporter.stats()
    # Every event is accounted for (other tests' leftover holds may add renewals).
    assert total["shipped"] + total["dropped"] + total["failed"] + total["queued"] >= len(seen) + 2


def test_a_server_that_is_down_costs_lock_calls_nothing(group: str) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    metrics = ylock.metrics.configure({"INFLUXDB": influx(down, BUFFER_SIZE=50, BATCH_SIZE=10, RETRIES=0,
                                                          FLUSH_INTERVAL=0.01)})
    engine = ylock.engine_from_url("local://")
    with collect() as seen:
        durations = lock_cycles(engine, group, 500)
    assert max(durations) < 0.25, max(durations)
    assert metrics.flush(10)
    stats = metrics.influxdb.stats()
    assert stats["shipped"] == 0 and stats["failed"] > 0 and stats["queued"] == 0
    assert stats["dropped"] + stats["failed"] >= len([e for e in seen if e.group == group]) == 1000
    assert "Connection refused" in stats["last_error"] or "NewConnectionError" in stats["last_error"]


def test_a_forked_child_ships_its_own_events_only(victoria_metrics: VictoriaMetrics, group: str) -> None:
    metrics = ylock.metrics.configure({"INFLUXDB": influx(victoria_metrics.url, FLUSH_INTERVAL=60.0,
                                                          BATCH_SIZE=1000)})
    engine = ylock.engine_from_url("local://")
    parent, child = group + "p", group + "c"
    with ylock.Lock(engine, parent, "x"):
        pass
    # The parent's two events wait in its writer (FLUSH_INTERVAL is long): not shipped yet.
    assert metrics.influxdb.stats()["shipped"] == 0
    pid = os.fork()
    if pid == 0:  # the child: inherits the queued events but must not ship them
        code = 1
        try:
            assert metrics.influxdb.stats()["queued"] == 0
            with ylock.Lock(engine, child, "x"):
                pass
            if metrics.flush(10) and metrics.influxdb.stats()["shipped"] >= 2:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert metrics.flush(10)
    for g in (parent, child):
        series = victoria_metrics.export(f'{{__name__="ylock_count", group="{g}"}}', samples=2)
        assert sum(len(s["values"]) for s in series) == 2, (g, series)


def test_closing_flushes_what_is_buffered(victoria_metrics: VictoriaMetrics, group: str) -> None:
    metrics = ylock.metrics.configure({"INFLUXDB": influx(victoria_metrics.url, FLUSH_INTERVAL=60.0,
                                                          BATCH_SIZE=1000)})
    engine = ylock.engine_from_url("local://")
    threads = [threading.Thread(target=lock_cycles, args=(engine, group, 50)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    exporter = metrics.influxdb
    ylock.metrics.shutdown(timeout=10)
    assert exporter.stats()["shipped"] >= 400 and exporter.stats()["queued"] == 0
    series = victoria_metrics.export(f'{{__name__="ylock_count", group="{group}"}}', samples=400)
    assert sum(sum(s["values"]) for s in series) == 400


def test_lost_locks_on_redis_are_exported(victoria_metrics: VictoriaMetrics, redis_engine: ylock.Engine,
                                          group: str) -> None:
    metrics = ylock.metrics.configure({"INFLUXDB": influx(victoria_metrics.url), "TAG_NAMES": [group]})
    lock = ylock.Lock(redis_engine, group, "ledger")
    lock.lock(timeout=5)
    assert redis_engine.force_release(group, "ledger")   # an operator's `ylock release`
    with pytest.raises(ylock.LockLost):
        lock.unlock()
    assert metrics.flush(10)
    series = by_name(victoria_metrics.export(f'{{__name__="ylock_count", group="{group}"}}', samples=3))
    assert {key[1] for key in series} == {"acquired", "released", "lost"}
    [lost] = next(v for k, v in series.items() if k[1] == "lost")
    assert lost["metric"]["engine"] == "redis" and lost["metric"]["name"] == "ledger"
