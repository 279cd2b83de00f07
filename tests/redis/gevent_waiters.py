"""Run by tests/redis/test_many_waiters.py in a process of its own: ``python gevent_waiters.py
URL GROUP N``. N greenlets of a gevent-patched process wait for one lock held by another
greenlet, which releases it once they are all queued; each takes it in turn. Prints
"<taken>/<N>" last; exits 1 on any error (EngineUnavailable included)."""
from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402 - after patching, as gevent wants
import time  # noqa: E402

import gevent  # noqa: E402
import gevent.event  # noqa: E402

import ylock  # noqa: E402


def main(url: str, group: str, count: int) -> int:
    engine = ylock.engine_from_url(url)
    taken: list[int] = []
    errors: list[BaseException] = []
    inside = [0]

    def wait() -> None:
        lock = ylock.Lock(engine, group, "g")
        try:
            with lock.write(timeout=60):
                inside[0] += 1
                assert inside[0] == 1, "two greenlets inside the lock"
                gevent.sleep(0)                     # let the others run while inside
                taken.append(lock.token or 0)
                inside[0] -= 1
        except BaseException as exc:  # noqa: BLE001 - reported
            errors.append(exc)

    holder = ylock.Lock(engine, group, "g")
    holder.lock()
    greenlets = [gevent.spawn(wait) for _ in range(count)]
    deadline = time.monotonic() + 60
    while sum(len(i.waiters) for i in engine.describe(group)) < count and not errors:
        if time.monotonic() > deadline:
            print("the greenlets never all queued")
            return 1
        gevent.sleep(0.05)
    holder.unlock()
    gevent.joinall(greenlets, timeout=80)
    for exc in errors[:3]:
        print(repr(exc))
    print(f"{len(taken)}/{count}")
    return 1 if errors or taken != sorted(taken) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
