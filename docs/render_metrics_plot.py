"""Render docs/metrics.png from real exported data.

Start a real ``redis-server`` and a real VictoriaMetrics (speaking InfluxDB's v2 write
API), run a contended workload through ylock with the InfluxDB exporter on, read the
points back from the server, and plot per-second wait percentiles, throughput and
timeouts per lock group. Needs matplotlib (``pip install matplotlib``).

    python docs/render_metrics_plot.py [--seconds 24] [--out docs/metrics.png]
"""
from __future__ import annotations

import argparse
import random
import threading
import time
from collections import defaultdict
from pathlib import Path

import ylock
import ylock.metrics
from ylock.testing.redis import RedisServer
from ylock.testing.victoriametrics import VictoriaMetrics


def worker(stop: threading.Event, start_at: float, action: callable) -> None:  # type: ignore[valid-type]
    while time.monotonic() < start_at and not stop.is_set():
        time.sleep(0.01)
    rng = random.Random()
    while not stop.is_set():
        action(rng)


def run_workload(engine: ylock.Engine, seconds: float) -> None:
    orders = ylock.Lock(engine, "orders", "global", timeout=0.1)
    users = ylock.Locks(engine, "users", timeout=1.0)
    reports = ylock.Lock(engine, "reports", "daily", timeout=2.0)

    def order(rng: random.Random) -> None:
        try:
            with orders:
                time.sleep(rng.uniform(0.004, 0.012))
        except ylock.LockTimeout:
            pass

    def user(rng: random.Random) -> None:
        try:
            with users.write(f"user-{rng.randrange(40)}"):
                time.sleep(rng.uniform(0.001, 0.004))
        except ylock.LockTimeout:
            pass

    def report(rng: random.Random) -> None:
        writer = rng.random() < 0.05
        with reports.write() if writer else reports.read():
            time.sleep(rng.uniform(0.02, 0.06) if writer else rng.uniform(0.002, 0.01))

    stop = threading.Event()
    now = time.monotonic()
    plan = ([(order, 0.0)] * 3 + [(order, seconds / 3)] * 4 + [(order, 2 * seconds / 3)] * 6
            + [(user, 0.0)] * 6 + [(report, 0.0)] * 6)
    threads = [threading.Thread(target=worker, args=(stop, now + at, action), daemon=True) for action, at in plan]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()


def per_second(series: list[dict], t0: float) -> dict[str, dict[int, list[float]]]:
    out: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in series:
        for ts, value in zip(s["timestamps"], s["values"]):
            out[s["metric"]["group"]][int(ts / 1000 - t0)].append(value)
    return out


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered), int(-(-p * len(ordered) // 100))) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=24.0)
    parser.add_argument("--out", default=str(Path(__file__).with_name("metrics.png")))
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with RedisServer() as redis, VictoriaMetrics() as vm:
        metrics = ylock.metrics.configure({
            "INFLUXDB": {"URL": vm.url, "TOKEN": "t", "ORG": "acme", "BUCKET": "locks"},
            "UNTAGGED_GROUPS": ["users"],
        })
        engine = ylock.engine_from_url(redis.url)
        t0 = time.time()
        run_workload(engine, args.seconds)
        assert metrics.flush(30), "exporter did not drain"
        shipped = metrics.influxdb.stats()
        print("exporter:", shipped)
        total = shipped["shipped"]
        counts = vm.export('{__name__="ylock_count"}', samples=total)
        waits = vm.export('{__name__="ylock_wait", outcome="acquired"}')
        holds = vm.export('{__name__="ylock_hold"}')
        engine.close()

    groups = ["orders", "users", "reports"]
    colors = {"orders": "tab:red", "users": "tab:blue", "reports": "tab:green"}
    wait_s, hold_s = per_second(waits, t0), per_second(holds, t0)
    acquired = per_second([s for s in counts if s["metric"]["outcome"] == "acquired"], t0)
    timed_out = per_second([s for s in counts if s["metric"]["outcome"] == "timed_out"], t0)
    seconds = range(int(args.seconds))

    fig, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    ax = axes[0]
    for g in groups:
        xs = [x for x in seconds if wait_s[g].get(x)]
        ax.plot(xs, [percentile(wait_s[g][x], 50) * 1000 for x in xs], color=colors[g], ls="--", lw=1,
                label=f"{g} p50")
        ax.plot(xs, [percentile(wait_s[g][x], 99) * 1000 for x in xs], color=colors[g], lw=1.5, label=f"{g} p99")
    ax.set_yscale("log")
    ax.set_ylabel("wait to acquire (ms)")
    ax.set_title("ylock on Redis: wait time per group (read back from the InfluxDB write API)")
    ax.legend(ncol=3, fontsize=8)
    ax = axes[1]
    for g in groups:
        ax.plot(seconds, [len(acquired[g].get(x, [])) for x in seconds], color=colors[g], label=f"{g} acquired/s")
    ax.bar(seconds, [len(timed_out["orders"].get(x, [])) for x in seconds], color="black", alpha=0.5,
           label="orders timeouts/s")
    ax.set_yscale("log")
    ax.set_ylabel("events per second")
    ax.legend(ncol=2, fontsize=8)
    ax = axes[2]
    for g in groups:
        xs = [x for x in seconds if hold_s[g].get(x)]
        ax.plot(xs, [percentile(hold_s[g][x], 99) * 1000 for x in xs], color=colors[g], label=f"{g} hold p99")
    ax.set_ylabel("hold (ms)")
    ax.set_xlabel("seconds (orders contenders: 3, then 7, then 13 threads)")
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out} from {total} exported events")


if __name__ == "__main__":
    main()
