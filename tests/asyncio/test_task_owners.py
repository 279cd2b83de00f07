"""The owner id of an asyncio task (``ylock.owner.current_owner``), looked up per lock call
in a table keyed by weak references to tasks: one id per task, kept for the task's life,
never shared with a child task, and forgotten with the task."""
from __future__ import annotations

import asyncio
import gc

from ylock import owner as owners


def test_each_task_has_its_own_owner_for_its_whole_life_and_the_entry_goes_with_it():
    async def child() -> str:
        return owners.current_owner()

    async def main() -> tuple[str, str, str, str, int]:
        first = owners.current_owner()
        await asyncio.sleep(0)
        again = owners.current_owner()
        kid = await asyncio.create_task(child())
        siblings = await asyncio.gather(*(child() for _ in range(50)))   # each a task of its own
        return first, again, kid, siblings[0], len(set(siblings))

    before = len(owners._task_owners)
    first, again, kid, sibling, distinct = asyncio.run(main())
    assert first == again                       # stable within the task
    assert kid != first and sibling != first    # a child task is another owner
    assert distinct == 50
    gc.collect()
    assert len(owners._task_owners) == before   # every entry went with its task
