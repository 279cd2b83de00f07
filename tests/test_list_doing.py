"""``ylock list`` (and ``manage.py ylock list``, ``flask ylock list``, which print the same
table) says what each holder is doing, as ``inspect`` does (issue #28)."""
from __future__ import annotations

import re
import threading

import ylock
from ylock import report
from ylock.owner import owner_scope


def test_list_shows_what_each_holder_is_doing() -> None:
    engine = ylock.engine_from_url("local://")
    lock = ylock.Lock(engine, "reports", "nightly")
    shared = ylock.Lock(engine, "reports", "catalog")
    with ylock.context("nightly export", job=42):
        lock.lock(timeout=1)
    readers = []
    for n in range(2):
        with owner_scope() as owner, ylock.context(f"reader {n}"):
            shared.rlock(timeout=1)
            readers.append(owner)
    quiet = ylock.Lock(engine, "reports", "quiet")
    thread = threading.Thread(target=lambda: quiet.lock(timeout=1))   # says nothing
    thread.start()
    thread.join(5)
    try:
        lines = report.table([("default", info) for info in engine.describe()]).splitlines()
    finally:
        lock.unlock()
        for owner in readers:
            with owner_scope(owner):
                shared.runlock()
        engine.force_release("reports", "quiet")
    assert lines[0].split() == list(report.COLUMNS)
    rows = {line.split()[2]: n for n, line in enumerate(lines) if line.startswith("default")}
    nightly = rows["nightly"]
    assert lines[nightly].split()[4] == ylock.current_owner()
    said = lines[nightly + 1]
    assert said.startswith(f"    {ylock.current_owner()}: nightly export, job=42, for ") and said.endswith("s")
    catalog = rows["catalog"]
    assert sorted(re.sub(r"for \d+s$", "for Ns", line) for line in lines[catalog + 1:catalog + 3]) == \
        sorted(f"    {o}: reader {n}, for Ns" for n, o in enumerate(readers))
    quiet_owner = lines[rows["quiet"]].split()[4]
    assert re.fullmatch(rf"    {re.escape(quiet_owner)}: for \d+s", lines[rows["quiet"] + 1])   # since when, at least
