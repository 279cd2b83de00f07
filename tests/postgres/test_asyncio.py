"""The asyncio suite of tests/asyncio (cancellation however it comes, tasks of several
processes) run on the PostgreSQL engine: the same test bodies, this engine."""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tests.asyncio import test_tasks, workers

spawn = multiprocessing.get_context("spawn")


def test_cancelled_while_queued_leaves_the_queue(postgres_engine, group):
    test_tasks.test_cancelled_while_queued_leaves_the_queue(postgres_engine, group)


def test_a_grant_racing_the_cancellation_is_given_back(postgres_engine, group):
    test_tasks.test_a_grant_racing_the_cancellation_is_given_back(postgres_engine, group)


def test_cancelled_inside_the_block_and_during_the_release(postgres_engine, group):
    test_tasks.test_cancelled_inside_the_block_and_during_the_release(postgres_engine, group)


@pytest.mark.slow
def test_tasks_of_three_processes_lose_no_update(postgres_server, group, tmp_path: Path):
    path = tmp_path / "counter"
    path.write_text("0")
    with ProcessPoolExecutor(3, mp_context=spawn) as pool:
        done = [f.result(timeout=180) for f in [pool.submit(workers.tasks_counter, postgres_server.url, group,
                                                            str(path), 10, 5) for _ in range(3)]]
    assert sum(done) == 150 and int(path.read_text()) == 150
