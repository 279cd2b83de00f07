"""``python -m bench.tracing [--quick] [--runs N] [--out DIR]``: what ylock's OpenTelemetry
traces (issue 19, :mod:`ylock.tracing`) cost an uncontended acquire+release, on the local
engine and on a redis-server that it starts itself on a free loopback port. Each number
is the median of ``--runs`` runs (5), with min and max; the cases are interleaved run by
run and every ratio is to ``off`` of the same run. Writes ``results/tracing.json`` and
``tracing.md``.

- **off**: ``ylock.tracing`` never enabled in this run's first sample (``disable()`` after
  that: the same path, the lock checks one module attribute).
- **extra not installed**: the same loop in a child process in which ``opentelemetry``
  cannot be imported (``sys.modules["opentelemetry"] = None``), beside the same child with
  it importable (``off (child)``); its ratio is to that child, a process started the same
  way (two processes differ by several per cent however alike they are). A third child
  checks that ``import ylock`` and a lock pair import no ``opentelemetry`` module
  (redis-py 8 imports it itself when it is installed, so the parent cannot tell).
- **API only (no-op tracer)**: ``ylock.tracing.enable()`` with ``opentelemetry-api`` and no
  SDK tracer provider configured: OpenTelemetry's global proxy hands out no-op spans.
- **SDK, no span processor**: ``enable(TracerProvider())`` of ``opentelemetry-sdk``: real
  spans, recorded and dropped at their end.
- **SDK + in-memory exporter**: the same with a ``SimpleSpanProcessor`` exporting to an
  ``InMemorySpanExporter`` (cleared after every sample); spans per pair counted.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import redis

import ylock
import ylock.tracing
from bench.common import HERE, bench_parser, machine, measure, run_bench, runs_of, stats
from ylock.testing.redis import RedisServer

MODES = ["off", "off (child)", "extra not installed", "API only (no-op tracer)", "SDK, no span processor",
         "SDK + in-memory exporter"]

# The children: argv = mode ("blocked", "importable" or "imports"), engine URL, lock name,
# seconds; print bench.run.measure's answer as JSON (or, for "imports", whether a lock pair
# imported opentelemetry).
_CHILD = """
import sys, time
mode = sys.argv[1]
if mode == "blocked":
    sys.modules["opentelemetry"] = None      # as if the otel extra were not installed
import ylock
lock = ylock.Lock(ylock.engine_from_url(sys.argv[2]), "bench", sys.argv[3])
def op():
    lock.lock()
    lock.unlock()
if mode == "imports":
    op()
    print(any(m == "opentelemetry" or m.startswith("opentelemetry.") for m in sys.modules))
    sys.exit(0)
import json
from bench.common import measure
server = None
if sys.argv[2].startswith("redis"):
    import redis
    server = redis.Redis.from_url(sys.argv[2])
result = measure(op, float(sys.argv[4]), server)
if mode == "blocked":
    assert sys.modules["opentelemetry"] is None and not any(
        m.startswith("opentelemetry.") for m in sys.modules), "something imported opentelemetry"
print(json.dumps(result))
"""


def _child(mode: str, url: str, name: str, seconds: float) -> str:
    root = str(HERE.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _CHILD, mode, url, name, str(seconds)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120 + seconds)
    if done.returncode != 0:
        raise RuntimeError(f"the {mode} child failed:\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


class TracingBench:
    def __init__(self, quick: bool, runs: int, seconds: float | None = None) -> None:
        self.quick = quick
        self.runs = runs
        self.seconds = seconds or (0.3 if quick else 1.0)
        self.redis = RedisServer().start()
        self.client = redis.Redis.from_url(self.redis.url)
        self.results: dict[str, Any] = {"machine": machine(), "quick": quick, "runs": runs,
                                        "load_before": os.getloadavg()}
        self.results["machine"]["redis_server"] = f"Redis server v={self.client.info('server')['redis_version']}"

    def close(self) -> None:
        self.results["load_after"] = os.getloadavg()
        ylock.tracing.disable()
        self.redis.stop()

    def uncontended(self) -> None:
        n = uuid.uuid4().hex[:8]
        engines = {"local": "local://", "redis": self.redis.url}
        ops: dict[str, Callable[[], None]] = {}
        for where, url in engines.items():
            lock = ylock.Lock(ylock.engine_from_url(url), "bench", f"t{where}{n}")

            def op(lock: ylock.Lock = lock) -> None:
                lock.lock()
                lock.unlock()
            ops[where] = op
        sdk = self._sdk()
        # How each in-process mode is switched on (all with the same lock objects).
        switch: dict[str, Callable[[], Any]] = {
            "off": ylock.tracing.disable,
            "API only (no-op tracer)": ylock.tracing.enable,      # the global proxy: no SDK provider set
            "SDK, no span processor": lambda: ylock.tracing.enable(sdk["bare"]),
            "SDK + in-memory exporter": lambda: ylock.tracing.enable(sdk["memory"]),
        }
        trivial = self.client.register_script("return 1")
        samples: dict[str, list[dict[str, float]]] = {"floor: Redis EVALSHA round trip": []}
        samples.update({f"{where}: {mode}": [] for where in engines for mode in MODES})
        spans_per_pair: list[float] = []

        def sample(where: str, mode: str, seconds: float) -> dict[str, float]:
            switch[mode]()
            try:
                return measure(ops[where], seconds, self.client if where == "redis" else None)
            finally:
                sdk["exporter"].clear()
                ylock.tracing.disable()
        for _ in range(self.runs):
            samples["floor: Redis EVALSHA round trip"].append(measure(trivial, self.seconds, self.client))
            for where, url in engines.items():
                samples[f"{where}: off"].append(sample(where, "off", self.seconds))
                # The local engine lives in one process: each child gets its own.
                for mode, child in (("off (child)", "importable"), ("extra not installed", "blocked")):
                    samples[f"{where}: {mode}"].append(json.loads(_child(child, url, f"c{where}{n}", self.seconds)))
                for mode in MODES[3:]:
                    samples[f"{where}: {mode}"].append(sample(where, mode, self.seconds))
                ylock.tracing.enable(sdk["memory"])
                for _ in range(200):
                    ops[where]()
                spans_per_pair.append(len(sdk["exporter"].get_finished_spans()) / 200)
                sdk["exporter"].clear()
                ylock.tracing.disable()
        rows: dict[str, Any] = {}
        for name, values in samples.items():
            rows[name] = stats([x["rate"] for x in values])
            for key in ("cpu_us", "server_us"):
                if key in values[0]:
                    rows[name][key] = statistics.median(x[key] for x in values)
        for where in engines:
            for mode in MODES:
                # "extra not installed" against the child like it, the others against "off"
                base = f"{where}: off (child)" if mode == "extra not installed" else f"{where}: off"
                row = rows[f"{where}: {mode}"]
                row["vs"] = base.split(": ")[1]
                row["vs_off"] = row["median"] / rows[base]["median"]
                row["cpu_us_added"] = row["cpu_us"] - rows[base]["cpu_us"]
                if "server_us" in row and "server_us" in rows[base]:
                    row["server_us_added"] = row["server_us"] - rows[base]["server_us"]
        # Each in-process mode against off, timed off, mode, mode, off back to back in short
        # rounds: steadier than the ratio of two medians when other work shares the machine.
        paired: dict[str, Any] = {}
        for where in engines:
            for mode in MODES[3:]:
                ratios = []
                for _ in range(2 * self.runs):
                    o1, m1, m2, o2 = (sample(where, x, self.seconds / 4)["rate"] for x in ("off", mode, mode, "off"))
                    ratios.append((m1 + m2) / (o1 + o2))
                paired[f"{where}: {mode}"] = stats(ratios)
        self.results["uncontended"] = rows
        self.results["paired"] = paired
        self.results["spans_per_pair"] = max(spans_per_pair)
        self.results["ylock_imports_opentelemetry_when_off"] = _child("imports", "local://", f"i{n}", 0) == "True"

    def _sdk(self) -> dict[str, Any]:
        from importlib.metadata import version

        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        # No global provider may be set here: "API only" must get OpenTelemetry's no-op.
        assert type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider", trace.get_tracer_provider()
        exporter = InMemorySpanExporter()
        memory = TracerProvider()
        memory.add_span_processor(SimpleSpanProcessor(exporter))
        self.results["versions"] = {"opentelemetry-api": version("opentelemetry-api"),
                                    "opentelemetry-sdk": version("opentelemetry-sdk")}
        return {"bare": TracerProvider(), "memory": memory, "exporter": exporter}


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    v = r.get("versions", {})
    lines = [f"Machine: {m['cpus']} cores, {m['cpu']}, Python {m['python']}, {m['redis_server']}, "
             f"opentelemetry-api {v.get('opentelemetry-api')}, opentelemetry-sdk {v.get('opentelemetry-sdk')}; "
             f"{m['when']}; medians of {r['runs']} runs" + (" (--quick)" if r["quick"] else "")
             + f"; load average {r['load_before'][0]:.1f} before, {r.get('load_after', ['?'])[0]:.1f} after "
             "(2 cores: other work was running).", "",
             "**Tracing cost, uncontended lock+unlock, one thread** (pairs/s; `ratio` = median ÷ the median of "
             "the case named in `to` (same engine, same run); `back to back` = the same ratio timed `to`, case, "
             "case, `to` in short rounds, median (min-max); CPU µs per pair of the client's thread and of the "
             "Redis server's main thread (medians) and what the case adds to those of `to`)", "",
             "| engine: tracing | median | min | max | ratio | to | back to back | client CPU µs | added | "
             "server CPU µs | added |", "|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|"]

    def f(v: Any, digits: int = 1, sign: bool = False) -> str:
        return "-" if v is None else f"{v:+,.{digits}f}" if sign else f"{v:,.{digits}f}"
    for name, row in r["uncontended"].items():
        pair = r.get("paired", {}).get(name)
        lines.append(f"| {name} | {row['median']:,.0f} | {row['min']:,.0f} | {row['max']:,.0f} | "
                     + (f"{row['vs_off']:.3f} | {row['vs']} | " if "vs" in row else "- | - | ")
                     + (f"{pair['median']:.3f} ({pair['min']:.2f}-{pair['max']:.2f}) | " if pair else "- | ")
                     + f"{f(row.get('cpu_us'))} | {f(row.get('cpu_us_added'), sign=True)} | "
                     f"{f(row.get('server_us'))} | {f(row.get('server_us_added'), sign=True)} |")
    lines += ["", f"A lock pair with tracing off imports OpenTelemetry: "
              f"{'yes' if r['ylock_imports_opentelemetry_when_off'] else 'no'} (checked in a child process); "
              f"spans per traced pair (in-memory exporter): {r['spans_per_pair']:.0f} (a wait span and a hold "
              "span).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = bench_parser("bench.tracing", __doc__, "tracing", sections=None).parse_args(argv)
    bench = TracingBench(args.quick, runs_of(args), args.seconds)
    return run_bench(bench, "uncontended", args, "tracing", markdown)


if __name__ == "__main__":
    main()
