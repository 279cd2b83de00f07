"""Prometheus and user exporters, the in-process aggregator, and settings validation."""
from __future__ import annotations

import random
import threading
import time

import pytest

import ylock
import ylock.metrics
from tests.helpers import Runner, collect
from ylock.events import Event
from ylock.metrics.aggregator import Aggregator, Reservoir

received: list[Event] = []
gate = threading.Event()


def record(event: Event) -> None:
    """A user exporter (configured by dotted path below)."""
    received.append(event)


def slow(event: Event) -> None:
    """A user exporter that hangs until the test lets it go."""
    gate.wait(30)


def broken(event: Event) -> None:
    raise RuntimeError("exporter bug")


def contend(engine: ylock.Engine, group: str) -> None:
    """Produce acquired, timed_out and released events (write) plus a read hold."""
    lock = ylock.Lock(engine, group, "global")
    with lock.write():
        contender = Runner(lambda: ylock.Lock(engine, group, "global").try_lock(0.02))
        contender.start()
        assert contender.outcome() is False
    with lock.read():
        pass


def test_prometheus_counts_events_and_observes_spans(group: str) -> None:
    metrics = ylock.metrics.configure({"PROMETHEUS": {"NAMESPACE": "locks"}})
    contend(ylock.engine_from_url("local://"), group)
    registry = metrics.prometheus.registry
    labels = {"group": group, "name": "*", "engine": "local", "mode": "write"}      # names: not by default
    assert registry.get_sample_value("locks_events_total", {**labels, "outcome": "acquired"}) == 1
    assert registry.get_sample_value("locks_events_total", {**labels, "outcome": "timed_out"}) == 1
    assert registry.get_sample_value("locks_events_total", {**labels, "mode": "read", "outcome": "released"}) == 1
    assert registry.get_sample_value("locks_wait_seconds_count", {**labels, "outcome": "timed_out"}) == 1
    assert registry.get_sample_value("locks_wait_seconds_sum", {**labels, "outcome": "timed_out"}) >= 0.02
    assert registry.get_sample_value("locks_hold_seconds_count", labels) == 1
    assert registry.get_sample_value("locks_hold_seconds_sum", labels) >= 0.02
    body, content_type = metrics.prometheus.expose()
    assert content_type.startswith("text/plain") and f'group="{group}"'.encode() in body


def test_prometheus_on_the_default_registry_is_built_once(group: str) -> None:
    import prometheus_client

    first = ylock.metrics.configure({"PROMETHEUS": {"REGISTRY": "default", "NAMESPACE": "ylock_default"}})
    second = ylock.metrics.configure({"PROMETHEUS": {"REGISTRY": "default", "NAMESPACE": "ylock_default"}})
    assert first.prometheus is second.prometheus and first.prometheus.registry is prometheus_client.REGISTRY
    with ylock.Lock(ylock.engine_from_url("local://"), group):
        pass
    assert prometheus_client.REGISTRY.get_sample_value(
        "ylock_default_events_total",
        {"group": group, "name": "*", "engine": "local", "mode": "write", "outcome": "released"}) == 1


def test_lock_names_are_labels_only_where_opted_in_and_bounded(group: str, caplog: pytest.LogCaptureFixture) -> None:
    """Labels are bounded by default: every name of a group is ``name="*"``, so 300 names make
    the series of one. ``TAG_NAMES`` lists the groups whose names are labels, each up to
    ``MAX_NAMES`` names per process (then ``*``, and one warning); ``UNTAGGED_GROUPS`` wins."""
    engine = ylock.engine_from_url("local://")
    fixed, family, quiet = group + "-orders", group + "-users", group + "-quiet"

    def series(registry: object, in_group: str) -> set[tuple[str, ...]]:
        return {tuple(sorted(s.labels.items())) for metric in registry.collect()  # type: ignore[attr-defined]
                for s in metric.samples if s.labels.get("group") == in_group}
    metrics = ylock.metrics.configure({"PROMETHEUS": {"NAMESPACE": "bounded"}})
    users = ylock.Locks(engine, family)
    for n in range(300):
        with users.write(f"user-{n}"):
            pass
    bounded = series(metrics.prometheus.registry, family)
    assert bounded and {dict(s)["name"] for s in bounded} == {"*"}
    ylock.metrics.shutdown()

    metrics = ylock.metrics.configure({"PROMETHEUS": {"NAMESPACE": "named"}, "MAX_NAMES": 3,
                                       "TAG_NAMES": [fixed, family, quiet], "UNTAGGED_GROUPS": [quiet]})
    orders, users, other = ylock.Locks(engine, fixed), ylock.Locks(engine, family), ylock.Locks(engine, quiet)
    with caplog.at_level("WARNING", logger="ylock.metrics"):
        for name in ("eu", "us", "eu"):
            with orders.write(name):
                pass
        for n in range(5):
            with users.write(f"user-{n}"), other.write(f"user-{n}"):
                pass
    registry = metrics.prometheus.registry
    assert {dict(s)["name"] for s in series(registry, fixed)} == {"eu", "us"}
    assert {dict(s)["name"] for s in series(registry, family)} == {"user-0", "user-1", "user-2", "*"}   # capped
    assert {dict(s)["name"] for s in series(registry, quiet)} == {"*"}
    assert registry.get_sample_value("named_events_total", {"group": family, "name": "*", "engine": "local",
                                                            "mode": "write", "outcome": "acquired"}) == 2
    capped = [r.getMessage() for r in caplog.records if "more than 3 lock names" in r.getMessage()]
    assert len(capped) == 1 and repr(family) in capped[0]


def test_unbounded_label_settings_are_named() -> None:
    keyed = {"users": "USER_LOCK (one lock per user)", "accounts": "@locked('accounts', key='account_id')"}
    prom = {"PROMETHEUS": True}
    assert ylock.metrics.unbounded(prom, keyed) == []                             # the default: bounded
    assert ylock.metrics.unbounded({**prom, "TAG_NAMES": ["orders"]}, keyed) == []
    assert ylock.metrics.unbounded({"TAG_NAMES": True}, keyed) == []              # no exporter: no labels
    [every] = ylock.metrics.unbounded({**prom, "TAG_NAMES": True}, keyed, setting="YLOCK['METRICS']")
    assert every.code == "W007" and every.problem.startswith("YLOCK['METRICS']['TAG_NAMES'] is True")
    assert "'users' by USER_LOCK" in every.problem and "'accounts' by @locked" in every.problem
    listed = ylock.metrics.unbounded({**prom, "TAG_NAMES": ["orders", "users", "accounts"],
                                      "UNTAGGED_GROUPS": ["accounts"]}, keyed, setting="YLOCK_METRICS")
    assert [w.problem for w in listed] == [
        "YLOCK_METRICS['TAG_NAMES'] lists 'users', whose locks are keyed by USER_LOCK (one lock per user): one "
        "set of series per key, without bound"]
    assert "leave 'users' out of it" in listed[0].hint


def test_user_exporters_run_off_the_lock_path(group: str) -> None:
    received.clear()
    gate.clear()
    metrics = ylock.metrics.configure({"EXPORTERS": [f"{__name__}.record", f"{__name__}.slow"]})
    engine = ylock.engine_from_url("local://")
    started = time.perf_counter()
    with collect() as seen:
        for _ in range(20):
            with ylock.Lock(engine, group):
                pass
    # ``slow`` blocks its thread on the first event, yet 20 lock cycles did not wait for it.
    assert time.perf_counter() - started < 1.0
    assert len(received) <= 1   # only what ``record`` saw before ``slow`` hung the thread
    gate.set()
    assert metrics.flush(10)
    mine = [e for e in seen if e.group == group]
    assert [e for e in received if e.group == group] == mine and len(mine) == 40


def test_a_failing_user_exporter_is_counted_not_raised(group: str) -> None:
    metrics = ylock.metrics.configure({"EXPORTERS": [f"{__name__}.broken"]})
    with ylock.Lock(ylock.engine_from_url("local://"), group):
        pass
    assert metrics.flush(10)
    stats = metrics.custom.stats()
    assert stats["failed"] >= 2 and stats["shipped"] == 0 and stats["last_error"] == "RuntimeError: exporter bug"


def test_the_aggregator_summarises_per_group(group: str) -> None:
    metrics = ylock.metrics.configure({})
    contend(ylock.engine_from_url("local://"), group)
    with ylock.Locks(ylock.engine_from_url("local://"), group + "x").write("a"):
        pass
    groups = ylock.metrics.stats()["groups"]
    assert groups is not None and metrics.aggregator is ylock.metrics.AGGREGATOR
    mine = groups[group]
    assert mine["counts"] == {"acquired": 2, "released": 2, "timed_out": 1}
    assert mine["wait"]["count"] == 3 and mine["wait"]["max"] >= 0.02
    assert mine["hold"]["count"] == 2 and mine["hold"]["p99"] == mine["hold"]["max"] >= 0.02
    assert groups[group + "x"]["counts"] == {"acquired": 1, "released": 1}


def test_reservoir_percentiles_and_bounded_memory() -> None:
    reservoir = Reservoir(size=1000, rng=random.Random(7))
    for i in range(1, 101):
        reservoir.add(i / 1000)
    assert reservoir.percentile(50) == 0.05 and reservoir.percentile(99) == 0.099
    assert reservoir.summary()["max"] == 0.1 and reservoir.summary()["count"] == 100
    for _ in range(100_000):
        reservoir.add(random.random())
    assert len(reservoir.sample) == 1000 and reservoir.count == 100_100
    assert reservoir.percentile(50) == pytest.approx(0.5, abs=0.06)   # a uniform sample of U(0, 1)


def test_the_aggregator_is_thread_safe() -> None:
    aggregator = Aggregator(reservoir_size=64)
    event = Event("released", "g", "n", "local", "write", hold=0.01)

    def hammer() -> None:
        for _ in range(5000):
            aggregator(event)
    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = aggregator.snapshot()["g"]
    assert snap["counts"] == {"released": 20_000} and snap["hold"]["count"] == 20_000


@pytest.mark.parametrize(("config", "message"), [
    ({"INFLUX": {}}, r"METRICS has unknown key 'INFLUX'"),
    ({"INFLUXDB": {"URL": "influx:8086", "ORG": "o", "BUCKET": "b"}}, r"METRICS\['INFLUXDB'\]\['URL'\]"),
    ({"INFLUXDB": {"URL": "http://x", "ORG": "o"}}, r"METRICS\['INFLUXDB'\]\['BUCKET'\]"),
    ({"INFLUXDB": {"URL": "http://x", "ORG": "o", "BUCKET": "b", "BATCH": 1}}, r"unknown key 'BATCH'"),
    ({"INFLUXDB": {"URL": "http://x", "ORG": "o", "BUCKET": "b", "BUFFER_SIZE": 0}}, r"\['BUFFER_SIZE'\]"),
    ({"EXPORTERS": "a.b"}, r"METRICS\['EXPORTERS'\] must be a list"),
    ({"EXPORTERS": ["nowhere.export"]}, r"'nowhere.export' cannot be imported"),
    ({"PROMETHEUS": {"REGISTRY": "mine"}}, r"\['REGISTRY'\] must be one of 'own', 'default'"),
    ({"TAG_NAMES": "orders"}, r"\['TAG_NAMES'\] must be a list of the lock groups whose names are tagged"),
    ({"TAG_NAMES": ["a/b"]}, r"\['TAG_NAMES'\] lists an invalid group"),
    ({"MAX_NAMES": 0}, r"\['MAX_NAMES'\] must be a whole number >= 1"),
    ({"UNTAGGED_GROUPS": "users"}, r"\['UNTAGGED_GROUPS'\] must be a list"),
])
def test_invalid_settings_name_the_setting(config: dict[str, object], message: str) -> None:
    with pytest.raises(ylock.ConfigurationError, match=message):
        ylock.metrics.validate(config, environ={})


def test_setting_names_follow_the_caller() -> None:
    with pytest.raises(ylock.ConfigurationError, match=r"^YLOCK_METRICS\['INFLUXDB'\]\['ORG'\]"):
        ylock.metrics.validate({"INFLUXDB": {"URL": "http://x"}}, setting="YLOCK_METRICS", environ={})


def test_closed_exporters_drop_nothing_into_memory(group: str) -> None:
    metrics = ylock.metrics.configure({"EXPORTERS": [f"{__name__}.record"]})
    exporter = metrics.custom
    ylock.metrics.shutdown()
    exporter(Event("acquired", group, "n", "local", "write"))
    assert exporter.stats()["queued"] == 0 and exporter not in ylock.events._subscribers
    assert exporter._thread is None


def test_the_grafana_dashboard_queries_what_the_exporter_writes() -> None:
    import json
    import re
    from pathlib import Path

    import ylock.metrics as package

    path = Path(package.__file__).parent / "grafana" / "ylock-dashboard.json"
    dashboard = json.loads(path.read_text())
    queries = [t["query"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(queries) >= 8
    for query in queries:
        [field] = re.findall(r'r\._field == "(\w+)"', query)
        assert field in ("count", "wait", "hold", "release")
        for outcome in re.findall(r'r\.outcome == "(\w+)"', query):
            assert outcome in ylock.events.KINDS
        assert 'contains(value: r.group, set: ${group:json})' in query
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for needed in ("wait", "hold", "acquisitions", "timeouts", "lost"):
        assert needed in titles
