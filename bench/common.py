"""What every ``python -m bench.<topic>`` shares: timing (:func:`rate`, :func:`measure`), ratios
timed in rounds a, b, b, a (:func:`paired_ratio`, :func:`paired`), the CPU the hypervisor stole
(:func:`steal_pct`), the medians of runs (:func:`median_rows`), the machine's description, and
the command line (:func:`bench_parser`, :func:`run_bench`). Nothing here imports a topic's
module, so every topic (and :mod:`bench.run`, which runs them all) imports it without a circle."""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from ylock.version import __version__

HERE = Path(__file__).resolve().parent
spawn = multiprocessing.get_context("spawn")


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def rate(func: Callable[[], Any], seconds: float, max_ops: int = 1_000_000) -> float:
    """Return calls of ``func`` per second over about ``seconds``."""
    func()
    ops, began = 0, time.perf_counter()
    deadline = began + seconds
    while ops < max_ops:
        for _ in range(50):
            func()
        ops += 50
        if time.perf_counter() >= deadline:
            break
    return ops / (time.perf_counter() - began)


def server_cpu(client: redis.Redis) -> float:
    """Return the CPU seconds the Redis server's main thread has used so far."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"])


def cpu_ticks() -> tuple[int, int]:
    """The machine's CPU time stolen by the hypervisor so far and all CPU time, in ticks
    (``/proc/stat``'s first line; (0, 0) where there is none)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks[:8])


def steal_pct(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the machine's CPU time that the hypervisor stole between two
    :func:`cpu_ticks`, in %: on a VM whose host is overcommitted, the figure that moves a
    round trip's rate the most (measured here: 30 % stolen, 1,010 lock pairs/s; 2 %, 2,346/s)."""
    total = after[1] - before[1]
    return 100.0 * (after[0] - before[0]) / total if total > 0 else 0.0


#: Rounds of :func:`paired_ratio` whose samples all saw at most this share of CPU stolen
#: give its ``quiet`` figure.
QUIET_STEAL_PCT = 5.0


def measure(func: Callable[[], Any], seconds: float, server: redis.Redis | Callable[[], float] | None = None,
            per_call: int = 1) -> dict[str, float]:
    """Call ``func`` for about ``seconds``; return calls per second of wall time (``rate``),
    microseconds of this thread's CPU per call (``cpu_us``), of this process's (all its
    threads: a library's background threads count too, ``process_cpu_us``) and, with
    ``server`` (a Redis client, or a function that returns the server's CPU seconds so
    far), of the server per call (``server_us``). ``per_call``: how many operations one
    call of ``func`` does (an asyncio batch): the figures are per operation. When other
    processes share the machine the CPU figures move less than the wall rate, but they move
    too (on a VM a busy host costs cache and cycles): compare them within one run."""
    server_seconds = (lambda: server_cpu(server)) if isinstance(server, redis.Redis) else server
    func()
    before = server_seconds() if server_seconds is not None else 0.0
    ticks = cpu_ticks()
    ops, began, cpu, pcpu = 0, time.perf_counter(), time.thread_time(), time.process_time()
    deadline = began + seconds
    batch = max(1, 10 // per_call)       # a slow side (an asyncio batch, ZooKeeper) stops in time
    while ops < 1_000_000:
        for _ in range(batch):
            func()
        ops += batch
        if time.perf_counter() >= deadline:
            break
    wall, cpu, pcpu = time.perf_counter() - began, time.thread_time() - cpu, time.process_time() - pcpu
    ops *= per_call
    out = {"rate": ops / wall, "cpu_us": cpu / ops * 1e6, "process_cpu_us": pcpu / ops * 1e6,
           "steal_pct": steal_pct(ticks, cpu_ticks())}
    if server_seconds is not None:
        out["server_us"] = (server_seconds() - before) / ops * 1e6
    return out


def paired_ratio(a: Callable[[], Any], b: Callable[[], Any], rounds: int, seconds: float,
                 server: redis.Redis | Callable[[], float] | None = None, per_call: int = 1) -> dict[str, Any]:
    """Return ``b``'s rate over ``a``'s: the median, min and max over ``rounds`` rounds, each
    timed a, b, b, a back to back, so that a drift of the machine's speed within a round
    cancels out (on a busy machine, far steadier than a ratio of two medians). Under ``a``
    and ``b``: each side's medians over the rounds of :func:`measure`'s figures (rate, client
    CPU µs per operation, with ``server`` the server's, the CPU stolen by the hypervisor).
    The stolen CPU and the quiet ratio as :func:`paired` gives them."""
    out = paired(lambda: measure(a, seconds, server, per_call), lambda: measure(b, seconds, server, per_call),
                 rounds, "rate")
    for side, samples in out.pop("samples").items():
        out[side] = {key: statistics.median(s[key] for s in samples) for key in samples[0]}
    return out


def paired(a: Callable[[], dict[str, Any]], b: Callable[[], dict[str, Any]], rounds: int,
           key: str) -> dict[str, Any]:
    """``b``'s ``key`` over ``a``'s, from ``rounds`` rounds of samples a, b, b, a (each call
    of ``a`` or ``b`` takes one sample: a dict with ``key`` and ``steal_pct``, the share of
    the CPU the hypervisor stole meanwhile): the median, min and max of the rounds' ratios;
    ``steal_pct``: the most stolen in each round's samples, over the rounds; ``quiet``: the
    ratio over the rounds where at most :data:`QUIET_STEAL_PCT` was stolen, and how many;
    ``samples``: every sample of each side, in order."""
    ratios, quiet, steals = [], [], []
    samples: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for _ in range(rounds):
        a1, b1, b2, a2 = (f() for f in (a, b, b, a))
        ratios.append((b1[key] + b2[key]) / (a1[key] + a2[key]))
        steal = max(s["steal_pct"] for s in (a1, b1, b2, a2))
        steals.append(steal)
        if steal <= QUIET_STEAL_PCT:
            quiet.append(ratios[-1])
        samples["a"] += [a1, a2]
        samples["b"] += [b1, b2]
    out: dict[str, Any] = stats(ratios)
    out["rounds"] = rounds
    # How much CPU the hypervisor stole (the most of a round's four samples), and the ratio
    # over the rounds where it stole little: every round counts in the median above.
    out["steal_pct"] = stats(steals)
    out["quiet"] = {**(stats(quiet) if quiet else {}), "rounds": len(quiet), "steal_pct_at_most": QUIET_STEAL_PCT}
    out["samples"] = samples
    return out


def with_steal(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s result (a dict) with the share of the CPU stolen meanwhile (``steal_pct``):
    a contended run as one sample of :func:`paired`."""
    ticks = cpu_ticks()
    row = run()
    row["steal_pct"] = steal_pct(ticks, cpu_ticks())
    return row


def pair_op(pair: tuple[Callable[[], Any], Callable[[], Any]]) -> Callable[[], None]:
    acquire, release = pair

    def op() -> None:
        acquire()
        release()
    return op


def median_rows(rows: list[dict[str, Any]], worst: dict[str, Callable[[list[Any]], Any]] | None = None,
                skip: tuple[str, ...] = (), spread: tuple[str, ...] = ()) -> dict[str, Any]:
    """The median of each field over the runs' ``rows`` (None where no run has a value). A
    field of ``worst`` takes that function instead: by default ``lost_updates`` takes the
    largest (a lock that lost updates once is broken). Fields in ``skip`` are left out; fields
    in ``spread`` also get their ``<field>_min`` and ``<field>_max``."""
    worst = {"lost_updates": max} if worst is None else worst
    out: dict[str, Any] = {}
    for key in rows[0]:
        if key in skip:
            continue
        values = [r[key] for r in rows if r[key] is not None]
        if not values:
            out[key] = None
        elif key in worst:
            out[key] = worst[key](values)
        else:
            out[key] = statistics.median(values)
            if key in spread:
                out[f"{key}_min"], out[f"{key}_max"] = min(values), max(values)
    return out


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for package in ("redis", "kazoo", "redis_lock", "pottery", "sherlock", "tooz"):
        try:
            from importlib.metadata import version

            versions[package] = version({"redis_lock": "python-redis-lock"}.get(package, package))
        except Exception:  # noqa: BLE001
            versions[package] = "not installed"
    redis_version = os.popen("redis-server --version").read().strip()
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "ylock": __version__,
            "redis_server": redis_version, "zookeeper": "3.8 (Debian)", "peers": versions,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


# -- the command line every bench module shares ------------------------------------------------

def bench_parser(module: str, doc: str | None, stem: str,
                 sections: str | None = "uncontended,contended") -> argparse.ArgumentParser:
    """The options every ``python -m bench.<module>`` takes: ``--quick``, ``--runs``, ``--out``,
    ``--seconds``, and unless ``sections`` is None ``--only`` and ``--duration``."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short samples, fewer runs")
    parser.add_argument("--runs", type=int, default=None, help="runs per number (default 5, quick 3)")
    parser.add_argument("--out", default=str(HERE / "results"), help=f"where to write {stem}.{{json,md}}")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per uncontended sample")
    if sections is not None:
        parser.add_argument("--only", default=sections, help="comma-separated sections")
        parser.add_argument("--duration", type=float, default=None, help="seconds per contended run")
    return parser


def runs_of(args: argparse.Namespace) -> int:
    """``--runs``, or its default: 3 quick, 5 otherwise."""
    return int(args.runs or (3 if args.quick else 5))


def run_bench(bench: Any, sections: str, args: argparse.Namespace, stem: str,
              markdown: Callable[[dict[str, Any]], str],
              finish: Callable[[dict[str, Any], Path], None] | None = None) -> dict[str, Any]:
    """Run ``bench``'s comma-separated ``sections`` in turn (closing it in the end, whatever
    happens), then write ``<stem>.json`` and ``<stem>.md`` in ``--out`` and print the table."""
    try:
        for section in sections.split(","):
            began = time.perf_counter()
            getattr(bench, section)()
            print(f"bench: {section} done in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    finally:
        bench.close()
    bench.results.setdefault("machine", {})["load_after"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(bench.results, indent=2, default=str))
    text = markdown(bench.results)
    (out / f"{stem}.md").write_text(text + "\n")
    if finish is not None:
        finish(bench.results, out)
    print(text)
    return bench.results
