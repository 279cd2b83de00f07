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

    async def main() -> tuple[str, str, str, list[str]]:
        first = owners.current_owner()
        await asyncio.sleep(0)
        again = owners.current_owner()
        kid = await asyncio.create_task(child())
        siblings = await asyncio.gather(*(child() for _ in range(50)))   # each a task of its own
        return first, again, kid, siblings

    first, again, kid, siblings = asyncio.run(main())
    assert first == again                            # stable within the task
    assert kid != first and siblings[0] != first     # a child task is another owner
    assert len(set(siblings)) == 50
    gc.collect()
    # every entry went with its task (other tests' tasks, in this worker process, are theirs)
    left = {first, kid, *siblings} & set(owners._task_owners.values())
    assert not left, f"{len(left)} owner entries outlived their tasks"
