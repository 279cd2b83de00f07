"""The record stores, on their own: both keep the same contract (begin, commit fenced by the
token, abort), the Redis one on a real server, the local one in memory; a stale holder's
commit is refused once a newer token has begun (the control: the newer holder's own commit
is accepted, so the store does write)."""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ylock.idempotency.records import (
    LocalRecords,
    MemorySlots,
    RecordStore,
    RedisRecords,
    StoredResponse,
    fingerprint,
    record_id,
)

RESPONSE = StoredResponse(201, "Created", (("Content-Type", "application/json"), ("X-Id", "7")), b'{"id": 7}\n\x00')


@pytest.fixture(params=["redis", "local"])
def store(request: pytest.FixtureRequest) -> Iterator[RecordStore]:
    if request.param == "local":
        yield LocalRecords(MemorySlots())
        return
    server = request.getfixturevalue("redis_server")
    client = redis.Redis.from_url(server.url)
    yield RedisRecords(client, f"t{uuid.uuid4().hex[:8]}:")
    client.close()


def test_begin_commit_replay(store: RecordStore) -> None:
    rid, fp = record_id("user-1", "k"), fingerprint("POST", "/pay", b"{}")
    assert store.get(rid) is None
    assert store.begin(rid, 10, fp, 60) is None
    in_flight = store.get(rid)
    assert in_flight is not None and in_flight.token == 10 and not in_flight.done
    assert store.commit(rid, 10, fp, RESPONSE, 60)
    done = store.begin(rid, 11, fp, 60)             # a later holder finds it done: no run
    assert done is not None and done.response == RESPONSE and done.fingerprint == fp


def test_a_stale_holder_cannot_overwrite_a_newer_one(store: RecordStore) -> None:
    rid, fp = record_id("", "k2"), fingerprint("POST", "/pay", b"{}")
    assert store.begin(rid, 10, fp, 60) is None     # the first holder, then paused past its lease
    assert store.begin(rid, 12, fp, 60) is None     # the retry, with a newer token
    assert not store.commit(rid, 10, fp, RESPONSE, 60)            # the paused one wakes: refused
    newer = StoredResponse(201, "Created", (), b"newer")
    assert store.commit(rid, 12, fp, newer, 60)
    assert not store.commit(rid, 11, fp, RESPONSE, 60)
    found = store.get(rid)
    assert found is not None and found.response == newer
    stale = store.begin(rid, 10, fp, 60)             # and it cannot begin again either
    assert stale is not None and stale.token == 12


def test_abort_frees_only_its_own_in_flight_record(store: RecordStore) -> None:
    rid, fp = record_id("", "k3"), fingerprint("DELETE", "/pay/1", b"")
    assert store.begin(rid, 5, fp, 60) is None
    store.abort(rid, 4)                              # not its record
    assert store.get(rid) is not None
    store.abort(rid, 5)
    assert store.get(rid) is None
    assert store.begin(rid, 6, fp, 60) is None and store.commit(rid, 6, fp, RESPONSE, 60)
    store.abort(rid, 6)                              # done: stays
    assert store.get(rid) is not None


def test_records_expire(store: RecordStore) -> None:
    rid, fp = record_id("", "k4"), fingerprint("POST", "/", b"")
    assert store.commit(rid, 1, fp, RESPONSE, 0.05) and store.get(rid) is not None
    deadline = time.monotonic() + 10
    while store.get(rid) is not None:
        assert time.monotonic() < deadline, "the record never expired"
        time.sleep(0.01)


def test_ids_and_fingerprints_keep_parts_apart() -> None:
    assert record_id("a:b", "c") != record_id("a", "b:c")
    assert fingerprint("POST", "/a", b"b") != fingerprint("POST", "/ab", b"")
    assert fingerprint("post", "/a", b"") == fingerprint("POST", "/a", b"")
    assert StoredResponse.decode(RESPONSE.encode()) == RESPONSE


def test_big_tokens_compare_as_numbers(redis_server: Any) -> None:
    client = redis.Redis.from_url(redis_server.url)
    store = RedisRecords(client, f"t{uuid.uuid4().hex[:8]}:")
    rid, fp = record_id("", "big"), "f"
    assert store.begin(rid, 99, fp, 60) is None
    assert store.begin(rid, 2**62, fp, 60) is None             # longer: newer
    assert not store.commit(rid, 999_999_999_999, fp, RESPONSE, 60)
    assert store.commit(rid, 2**62, fp, RESPONSE, 60)
    client.close()
