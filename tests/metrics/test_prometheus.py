"""The Prometheus exporter: batches land where ``observe()`` puts them; and in
``prometheus_client``'s multiprocess mode, with real processes
(any pre-fork server, Celery's prefork pool): each process writes its values to its own
files in ``$PROMETHEUS_MULTIPROC_DIR``, a scrape in any process answers with every
process's totals, a process that exits keeps its counts (its pending events are written at
exit), and the shipped gunicorn hooks forget a dead worker's live gauges and clear a
previous run's files. Also: the metrics can be configured again after ``shutdown`` on the
default registry, and a multiprocess directory that cannot work is a clear error."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import ylock
import ylock.metrics
from ylock.metrics import prometheus

ROOT = Path(__file__).resolve().parents[2]

#: A worker: takes the lock ``count`` times, then exits. Its pump thread never runs (as if the
#: worker were recycled right after its last request): only the drain at exit writes its events.
WORKER = """
import sys
import ylock, ylock.metrics, ylock.metrics.deferred
ylock.metrics.deferred._pump = object()
ylock.metrics.configure({"PROMETHEUS": True, "EXPORTERS": ["tests.metrics.test_exporters.record"]})
engine = ylock.engine_from_url("local://")
group, count = sys.argv[1], int(sys.argv[2])
for _ in range(count):
    with ylock.Lock(engine, group, "global"):
        pass
print("done", flush=True)
"""

#: A scraper: takes the lock ``count`` times too, then prints what its /metrics would answer.
SCRAPER = WORKER.replace('print("done", flush=True)', """
metrics = ylock.metrics.configure({"PROMETHEUS": True, "EXPORTERS": ["tests.metrics.test_exporters.record"]})
sys.stdout.write(metrics.prometheus.expose()[0].decode())
""")


def run(script: str, directory: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory), "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out


def samples(text: str, name: str, group: str) -> dict[str, float]:
    """``name``'s samples of ``group`` in a text exposition, by outcome."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels.get("group") == group:
                out[s.labels.get("outcome", "")] = out.get(s.labels.get("outcome", ""), 0.0) + s.value
    return out


def test_any_process_scrapes_every_process_totals(tmp_path: Path, group: str) -> None:
    directory = tmp_path / "prom"
    directory.mkdir()
    workers = [run(WORKER, directory, group, "200") for _ in range(3)]
    pids = [w.pid for w in workers]
    for worker in workers:
        assert finish(worker) == "done\n"
    # Every worker has exited: what they counted is in their own files, pending events included.
    assert {p.name for p in directory.glob("counter_*.db")} == {f"counter_{pid}.db" for pid in pids}
    text = finish(run(SCRAPER, directory, group, "7"))   # and the scraper's own, not yet pumped
    assert samples(text, "ylock_events_total", group) == {"acquired": 607, "released": 607}
    assert samples(text, "ylock_wait_seconds_count", group) == {"acquired": 607}
    assert samples(text, "ylock_hold_seconds_count", group) == {"": 607}
    assert samples(text, "ylock_hold_seconds_bucket", group)[""] >= 607     # cumulative buckets, + Inf
    assert "ylock_events_created" not in text           # multiprocess mode: no _created series
    assert 'ylock_exporter_dropped_total{exporter="custom"} 0.0' in text

    # gunicorn's child_exit: a dead worker's live gauges go, its counts stay.
    assert (directory / f"gauge_livesum_{pids[0]}.db").exists()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    try:
        prometheus.child_exit(None, types.SimpleNamespace(pid=pids[0]))
        assert not (directory / f"gauge_livesum_{pids[0]}.db").exists()
        assert (directory / f"counter_{pids[0]}.db").exists()
        # gunicorn's on_starting: a new run starts from nothing.
        (directory / "notes.txt").write_text("not ours")
        prometheus.on_starting(None)
        assert sorted(p.name for p in directory.iterdir()) == ["notes.txt"]
    finally:
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]


def test_a_multiprocess_directory_that_cannot_work_is_an_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    with pytest.raises(ylock.ConfigurationError, match=r"^\$PROMETHEUS_MULTIPROC_DIR must be an existing directory"):
        ylock.metrics.validate({"PROMETHEUS": True})
    # This process imported prometheus_client without the variable: its values stay here.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with pytest.raises(ylock.ConfigurationError, match=r"set after prometheus_client was imported") as caught:
        ylock.metrics.configure({"PROMETHEUS": True})
    assert caught.value.code == "E011"


def test_the_default_registry_takes_the_metrics_again_after_shutdown(group: str) -> None:
    import prometheus_client

    config = {"PROMETHEUS": {"REGISTRY": "default", "NAMESPACE": "ylock_again"}}
    labels = {"group": group, "name": "*", "engine": "local", "mode": "write", "outcome": "acquired"}
    engine = ylock.engine_from_url("local://")
    for expected in (1, 2):
        ylock.metrics.configure(config)
        with ylock.Lock(engine, group):
            pass
        value = prometheus_client.REGISTRY.get_sample_value("ylock_again_events_total", labels)
        ylock.metrics.shutdown()
        # A new exporter counts from 0 (its metrics are new); the first one's are gone from the registry.
        assert value == 1, expected
    assert prometheus_client.REGISTRY.get_sample_value("ylock_again_events_total", labels) is None


def test_a_batch_lands_in_the_buckets_observe_would_choose(group: str) -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from ylock.events import Event

    exporter = prometheus.PrometheusExporter()
    waits = [0.0, 0.0005, 0.00051, 0.005, 0.0049, 0.3, 1.0, 60.0, 61.0, 1e6, *[i / 997 for i in range(500)]]
    exporter.apply([Event("acquired", group, "global", "redis", "write", wait=w) for w in waits])
    reference = Histogram("reference", "", registry=CollectorRegistry(), buckets=prometheus.BUCKETS)
    for wait in waits:
        reference.observe(wait)
    labels = {"group": group, "name": "*", "engine": "redis", "mode": "write", "outcome": "acquired"}
    for bound in [*prometheus.BUCKETS, float("inf")]:
        le = "+Inf" if bound == float("inf") else repr(bound)
        assert exporter.registry.get_sample_value("ylock_wait_seconds_bucket", {**labels, "le": le}) == \
            reference.collect()[0].samples[[*prometheus.BUCKETS, float("inf")].index(bound)].value, le
    assert exporter.registry.get_sample_value("ylock_wait_seconds_sum", labels) == pytest.approx(sum(waits))
    assert exporter.registry.get_sample_value("ylock_wait_seconds_count", labels) == len(waits)
    # The batched path was taken (not observe() per value): one update per touched bucket.
    assert list(exporter._batchable.values()) == [True]
