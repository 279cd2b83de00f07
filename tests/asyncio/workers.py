"""Code run in child processes (spawned) by the asyncio tests."""
from __future__ import annotations

import asyncio
from pathlib import Path

import ylock


def tasks_counter(url: str, group: str, path: str, tasks: int, increments: int) -> int:
    """``tasks`` asyncio tasks, each incrementing the number in ``path`` ``increments`` times
    (read, await, write) inside the lock; return how many increments were made."""
    async def main() -> int:
        lock_engine = ylock.engine_from_url(url)

        async def task() -> int:
            for _ in range(increments):
                async with ylock.Lock(lock_engine, group, "counter").write(timeout=60):
                    value = int(Path(path).read_text() or 0)
                    await asyncio.sleep(0.001)            # another task runs here: the race a lock closes
                    Path(path).write_text(str(value + 1))
            return increments
        return sum(await asyncio.gather(*[task() for _ in range(tasks)]))
    return asyncio.run(main())
