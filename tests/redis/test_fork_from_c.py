"""A fork made from C (uWSGI's workers without ``--lazy-apps``; here libc's ``fork()``
through ctypes) runs none of Python's fork hooks: ylock notices the new process on its
first use there, and the child neither shares its parent's owner ids, holds, renewal
thread nor connections. On a real redis-server."""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import select
import subprocess
import sys
import time

import pytest

import ylock
from ylock import owner
from ylock.exiting import release_all
from ylock.owner import current_owner

pytestmark = pytest.mark.timeout(60)

PAIRS = 300
LEASE = 1.0


def fork_from_c() -> int:
    """fork() without Python's hooks. PyDLL keeps the GIL across the call, so the child
    starts with it, as uWSGI's workers do."""
    return int(ctypes.PyDLL(None).fork())


def read_line(fd: int, timeout: float) -> bytes:
    """Read one line from ``fd`` within ``timeout`` seconds (the test fails, never hangs)."""
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], f"no line from the other process: {data!r}"
        chunk = os.read(fd, 65536)
        assert chunk, f"the other process closed the pipe: {data!r}"
        data += chunk
    return data


def pairs(lock: ylock.Lock) -> int:
    """Take and give back ``lock`` PAIRS times; return how many pairs went wrong."""
    wrong = 0
    for _ in range(PAIRS):
        try:
            if lock.try_lock(2):
                lock.unlock()
            else:
                wrong += 1
        except ylock.LockError:
            wrong += 1
    return wrong


def child(engine: ylock.Engine, group: str, held: ylock.Lock, to_parent: int, from_parent: int) -> None:
    result: dict[str, object] = {}
    try:
        result["owner"] = current_owner()
        result["took the parent's lock"] = held.try_lock(0)   # a re-entry, were the ids shared
        mine = ylock.Lock(engine, group, "child", lease=LEASE)
        mine.lock(timeout=5)
        os.write(to_parent, b"holding\n")
        result["wrong pairs"] = pairs(ylock.Lock(engine, group, "child-pairs"))
        read_line(from_parent, 30)
        result["released at exit"] = release_all()          # what an exit would release: its own only
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result["error"] = repr(exc)
    finally:
        os.write(to_parent, json.dumps(result).encode() + b"\n")
        os._exit(0)


def scenario(url: str, group: str, detect: str) -> dict[str, object]:
    """The parent's side, run in an interpreter of its own (see the test)."""
    if detect == "pid":
        owner._same_process = owner._PidMark()
    else:
        assert isinstance(owner._same_process, mmap.mmap), "a Linux kernel from 4.14 on has MADV_WIPEONFORK"
    engine = ylock.engine_from_url(url)
    # The parent's lease is long, so its renewal thread sleeps through the fork (see the test).
    held = ylock.Lock(engine, group, "parent", lease=30.0)
    held.lock()        # the parent holds: its owner id, its hold, its watchdog, its pooled connections
    parent_owner = current_owner()
    to_parent, child_out = os.pipe()
    child_in, to_child = os.pipe()
    pid = fork_from_c()
    if pid == 0:
        child(engine, group, held, child_out, child_in)
    os.close(child_out)
    os.close(child_in)
    try:
        assert read_line(to_parent, 20) == b"holding\n"
        holding_since = time.monotonic()
        # Both processes work on the engine at once: were they on one socket, replies would cross.
        parent_wrong = pairs(ylock.Lock(engine, group, "parent-pairs"))
        # The child's hold outlives its lease: its own watchdog renews it.
        other = ylock.Lock(engine, group, "child")
        while time.monotonic() - holding_since < 2 * LEASE:
            assert other.try_lock(0) is False, "the child's hold expired: nobody renews it"
            info = engine.describe_lock(group, "child")
            assert info is not None and info.owners != (parent_owner,)
        os.write(to_child, b"done\n")
        result = json.loads(read_line(to_parent, 30))
    finally:
        os.close(to_child)
        os.waitpid(pid, 0)
    result.update({"pid": pid, "parent owner": parent_owner, "parent wrong pairs": parent_wrong,
                   "parent still holds": held.held() and not held.lost})
    held.unlock()
    result["parent's lock left"] = engine.describe_lock(group, "parent") is not None
    engine.close()
    return result


@pytest.mark.parametrize("detect", ["wipe-on-fork page", "pid"])
def test_a_fork_made_from_c_shares_no_owner_hold_or_connection(redis_server, group, detect):
    # In an interpreter of its own, as uWSGI's master is: a fork made from C skips
    # PyOS_AfterFork_Child, so CPython's GIL is not re-made in the child, and a child forked
    # while some other thread waited for the GIL (the test runner's, other tests' leftovers)
    # hangs at its first GIL hand-over, whatever it runs.
    done = subprocess.run([sys.executable, __file__, redis_server.url, group, detect], capture_output=True,
                          text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert "error" not in result, result["error"]
    assert result["owner"] != result["parent owner"]
    assert result["owner"].split(":")[1] == str(result["pid"])
    assert result["took the parent's lock"] is False
    assert result["wrong pairs"] == 0 and result["parent wrong pairs"] == 0
    assert result["released at exit"] == 1, "the child released its parent's holds, or not its own"
    assert result["parent still holds"]
    assert not result["parent's lock left"]


if __name__ == "__main__":
    print(json.dumps(scenario(*sys.argv[1:4])), flush=True)
