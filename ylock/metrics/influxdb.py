"""Export lock events to InfluxDB 2 (or anything speaking its ``/api/v2/write`` API).

One point per event, in measurement ``ylock`` (configurable)::

    ylock,group=orders,name=global,engine=redis,mode=write,outcome=acquired count=1i,wait=0.0021 <ns>
    ylock,group=orders,name=global,engine=redis,mode=write,outcome=released count=1i,hold=0.153,release=0.0004 <ns>

Tags: ``group``, ``name`` (``*`` when names are not tagged, see :mod:`ylock.metrics.tags`),
``engine``, ``mode`` (``none`` for waiter evictions), ``outcome`` (the event kind:
acquired, timed_out, released, renewed, lost, waiter_evicted...), plus any static
``TAGS`` (e.g. the host). Fields: ``count`` (always 1), and the spans in seconds when the
event carries them: ``wait`` (acquired, timed_out), ``hold`` and ``release`` (released).

Shipping is :class:`~ylock.metrics.background.Shipper`'s: a bounded buffer, one thread
per process, batches written with ``influxdb-client``'s synchronous write API (its
``WritesRetry`` backs off on 429/503 and connection errors, honouring ``Retry-After``).
Why not influxdb-client's own batching ``WriteApi``: it buffers without bound in its Rx
pipeline while InfluxDB is down, and gives no count of what it lost; here the buffer is
bounded and every dropped event is counted (:meth:`InfluxExporter.stats`).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from ylock import options as opt
from ylock.events import Event
from ylock.metrics.background import Shipper
from ylock.metrics.tags import Tagging

#: Environment variables read for settings the configuration dict leaves out.
ENVIRON = {"URL": "INFLUXDB_URL", "TOKEN": "INFLUXDB_TOKEN", "ORG": "INFLUXDB_ORG", "BUCKET": "INFLUXDB_BUCKET"}

#: Every key an ``INFLUXDB`` settings dict may have, with its default.
DEFAULTS: dict[str, Any] = {
    "URL": None, "TOKEN": None, "ORG": None, "BUCKET": None,
    "MEASUREMENT": "ylock", "TAGS": {}, "BUFFER_SIZE": 10_000, "BATCH_SIZE": 500,
    "FLUSH_INTERVAL": 1.0, "TIMEOUT": 5.0, "RETRIES": 2, "GZIP": False, "VERIFY_SSL": True,
}


def settings_from(config: Mapping[str, Any] | bool | None, environ: Mapping[str, str] | None = None,
                  setting: str = "METRICS['INFLUXDB']") -> dict[str, Any]:
    """Return the full, validated settings: ``config`` over the environment over defaults.

    Raise :class:`ylock.ConfigurationError` naming the setting that is wrong.
    """
    environ = os.environ if environ is None else environ
    code = opt.E_METRICS
    if config is not True and config is not None and not isinstance(config, Mapping):
        raise opt.fail(setting, f"must be a dict (or True to read INFLUXDB_* variables), got {config!r}", code)
    if config is None or config is True:
        config = {}
    opt.section(config, setting, DEFAULTS, code=code)      # a dict of known keys
    out = dict(DEFAULTS)
    for key, var in ENVIRON.items():
        if environ.get(var):
            out[key] = environ[var]
    out.update({k: v for k, v in config.items() if v is not None})
    url = out["URL"]
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise opt.fail(f"{setting}['URL'] (or $INFLUXDB_URL)", f"must be an http(s):// URL, got {url!r}", code)
    for key in ("ORG", "BUCKET"):
        opt.text(out[key], f"{setting}[{key!r}] (or ${ENVIRON[key]})", code=code)
    if out["TOKEN"] is not None:
        opt.text(out["TOKEN"], f"{setting}['TOKEN']", code=code, empty=True)
    opt.text(out["MEASUREMENT"], f"{setting}['MEASUREMENT']", code=code)
    tags = out["TAGS"]
    if not isinstance(tags, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise opt.fail(f"{setting}['TAGS']", f"must be a dict of str to str, got {tags!r}", code)
    for key in ("BUFFER_SIZE", "BATCH_SIZE"):
        opt.number(out[key], f"{setting}[{key!r}]", minimum=1, integer=True, code=code)
    opt.number(out["RETRIES"], f"{setting}['RETRIES']", minimum=0, maximum=100, integer=True, code=code)
    for key in ("FLUSH_INTERVAL", "TIMEOUT"):
        opt.seconds(out[key], f"{setting}[{key!r}]", maximum=3600, code=code)
    return out


class InfluxExporter(Shipper):
    """Write every lock event as a point to InfluxDB, off the lock path (see the module doc)."""

    kind = "influxdb"

    def __init__(self, url: str, org: str, bucket: str, token: str | None = None, *,
                 measurement: str = "ylock", tags: Mapping[str, str] | None = None,
                 tagging: Tagging | None = None, timeout: float = 5.0, retries: int = 2,
                 gzip: bool = False, verify_ssl: bool = True, buffer_size: int = 10_000,
                 batch_size: int = 500, flush_interval: float = 1.0) -> None:
        super().__init__(buffer_size=buffer_size, batch_size=batch_size, flush_interval=flush_interval)
        import influxdb_client  # noqa: F401 - fail at configuration time, not in the thread

        self.url = url
        self.org = org
        self.bucket = bucket
        self.token = token
        self.measurement = measurement
        self.static_tags = dict(tags or {})
        self.tagging = tagging or Tagging()
        self.timeout = float(timeout)
        self.retries = retries
        self.gzip = gzip
        self.verify_ssl = verify_ssl
        self._client: Any = None
        self._write_api: Any = None
        self._client_pid = 0
        self._client_mutex = threading.Lock()

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | bool | None, *, tagging: Tagging | None = None,
                    environ: Mapping[str, str] | None = None) -> InfluxExporter:
        """Build from an ``INFLUXDB`` settings dict (keys in :data:`DEFAULTS`), filling
        ``URL``, ``TOKEN``, ``ORG`` and ``BUCKET`` from ``$INFLUXDB_*`` when left out."""
        s = settings_from(config, environ)
        return cls(s["URL"], s["ORG"], s["BUCKET"], s["TOKEN"], measurement=s["MEASUREMENT"], tags=s["TAGS"],
                   tagging=tagging, timeout=s["TIMEOUT"], retries=s["RETRIES"], gzip=s["GZIP"],
                   verify_ssl=s["VERIFY_SSL"], buffer_size=s["BUFFER_SIZE"], batch_size=s["BATCH_SIZE"],
                   flush_interval=s["FLUSH_INTERVAL"])

    def __repr__(self) -> str:
        return f"<InfluxExporter {self.url} org={self.org} bucket={self.bucket}>"

    def point(self, event: Event) -> Any:
        """Return the ``influxdb_client.Point`` of ``event``."""
        from influxdb_client.client.write import point as point_module
        from influxdb_client.domain.write_precision import WritePrecision

        group, name, engine, mode, outcome = self.tagging.labels(event)
        point_class: Any = point_module.Point   # untyped library code
        point = point_class(self.measurement)
        for key, value in self.static_tags.items():
            point.tag(key, value)
        point.tag("group", group).tag("name", name).tag("engine", engine).tag("mode", mode).tag("outcome", outcome)
        point.field("count", 1)
        if event.wait is not None:
            point.field("wait", float(event.wait))
        if event.hold is not None:
            point.field("hold", float(event.hold))
        if event.release is not None:
            point.field("release", float(event.release))
        return point.time(int(event.timestamp * 1e9), WritePrecision.NS)

    def ship(self, batch: list[Event]) -> None:
        """Write ``batch`` in one request (retried per ``retries``); raise if it failed."""
        from influxdb_client.domain.write_precision import WritePrecision

        self._api().write(self.bucket, self.org, [self.point(e) for e in batch], write_precision=WritePrecision.NS)

    def _api(self) -> Any:
        # One client per process, built in the thread that uses it: a forked child must
        # not share its parent's HTTP connections.
        if self._write_api is None or self._client_pid != os.getpid():
            with self._client_mutex:
                if self._write_api is None or self._client_pid != os.getpid():
                    from influxdb_client.client.influxdb_client import InfluxDBClient
                    from influxdb_client.client.write.retry import WritesRetry
                    from influxdb_client.client.write_api import SYNCHRONOUS

                    retry = WritesRetry(total=self.retries, retry_interval=0.5, max_retry_delay=5.0,
                                        max_retry_time=max(self.timeout * (self.retries + 1), 10.0),
                                        exponential_base=2, allowed_methods=["POST"]) if self.retries else False
                    self._client = InfluxDBClient(self.url, token=self.token or "", org=self.org,
                                                  timeout=int(self.timeout * 1000), enable_gzip=self.gzip,
                                                  verify_ssl=self.verify_ssl, retries=retry)
                    self._write_api = self._client.write_api(write_options=SYNCHRONOUS)
                    self._client_pid = os.getpid()
        return self._write_api

    def close(self, timeout: float = 2.0) -> None:
        """Flush and stop the thread, then close the HTTP client."""
        super().close(timeout)
        client, self._client, self._write_api = self._client, None, None
        if client is not None and self._client_pid == os.getpid():
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    def _after_fork(self) -> None:
        super()._after_fork()
        self._client_mutex = threading.Lock()
        self._client = None
        self._write_api = None
