"""celery_ylock.beat in one process: the shared schedule state on each engine that keeps it
(the session's redis-server and ZooKeeper, and the local engine), the terms and claims of
two leaders on the local engine, the settings' errors, and what a task reads of a send."""
from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from celery import Celery
from celery.beat import PersistentScheduler, ScheduleEntry, Scheduler

import celery_ylock
import celery_ylock.beat
import ylock
from celery_ylock import signals
from celery_ylock.beat.leader import BeatLeader, Record
from celery_ylock.beat.scheduler import LeaderScheduler, entry_time, epoch, leader_class, merge
from celery_ylock.beat.settings import beat_settings
from celery_ylock.beat.state import CLAIMED, CONFLICT, FENCED, Opened, store_for

# -- the shared state, on every engine that keeps it ---------------------------------------------------


@pytest.fixture(params=["redis", "zookeeper", "local"])
def store_engine(request: pytest.FixtureRequest) -> ylock.Engine:
    return request.getfixturevalue(f"{request.param}_engine")  # type: ignore[no-any-return]


def test_a_term_raises_the_fence_and_a_claim_needs_it(store_engine: ylock.Engine) -> None:
    group = "beat-" + uuid.uuid4().hex[:8]
    store = store_for(store_engine, group, "global")
    first = store.open_term(100, '{"sender": "h:1"}')
    assert first == Opened(None, 1, {})
    assert store.claim(100, "a", None, "r1") == (CLAIMED, None)
    assert store.claim(100, "a", None, "r2") == (CONFLICT, "r1")          # a run it did not know of
    assert store.claim(100, "a", "r1", "r2") == (CLAIMED, None)
    assert store.open_term(100, "again") == Opened('{"sender": "h:1"}', 1, {"a": "r2"})   # same term: no new one
    assert store.open_term(99, "older") == 100                             # an older term is refused
    second = store.open_term(200, '{"sender": "h:2"}')
    assert second == Opened('{"sender": "h:1"}', 2, {"a": "r2"})
    assert store.claim(100, "a", "r2", "stale") == (FENCED, "200")          # the old term after the new one began
    assert store.claim(200, "b", None, "r3") == (CLAIMED, None)
    state = store.read()
    assert state["fence"] == "200" and state["terms"] == "2" and state["e:a"] == "r2" and state["e:b"] == "r3"


def test_tokens_past_two_to_the_53_compare_exactly(store_engine: ylock.Engine) -> None:
    """Lua numbers are doubles: the Redis scripts compare tokens as decimal strings."""
    store = store_for(store_engine, "beat-" + uuid.uuid4().hex[:8], "global")
    big = 2**62 + 1
    assert isinstance(store.open_term(big, "x"), Opened)
    assert store.open_term(big - 1, "y") == big
    assert store.claim(big - 1, "a", None, "r") == (FENCED, str(big))
    assert isinstance(store.open_term(big + 1, "z"), Opened)


# -- two leaders on the local engine ------------------------------------------------------------------


@pytest.fixture
def local_app() -> Celery:
    app = Celery("beat-" + uuid.uuid4().hex[:6], broker="memory://", set_as_current=False)
    app.conf.update(ylock_url="local://", ylock_beat={"lock": "beat", "lease": 5, "poll": 0.05})
    return app


class Beat:
    """A BeatLeader whose calls all run on one thread of its own (its lock's owner)."""

    def __init__(self, app: Celery) -> None:
        self.thread = ThreadPoolExecutor(1)
        self.leader = self.call(BeatLeader, app, beat_settings(app), "celery.beat.Scheduler")

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        return self.thread.submit(func, *args).result(30)


@pytest.fixture
def two(local_app: Celery) -> Iterator[tuple[Beat, Beat]]:
    a, b = Beat(local_app), Beat(local_app)
    yield a, b
    for beat in (a, b):
        beat.call(beat.leader.close)
        beat.thread.shutdown()


def test_one_leads_the_other_stands_by_and_takes_over_with_the_records(two: tuple[Beat, Beat]) -> None:
    a, b = two
    elected: list[dict[str, Any]] = []
    stepped: list[dict[str, Any]] = []

    def on_elected(sender: str, **kw: Any) -> None:
        elected.append(kw)

    def on_stepped(sender: str, **kw: Any) -> None:
        stepped.append(kw)
    signals.beat_elected.connect(on_elected)
    signals.beat_stepped_down.connect(on_stepped)
    acquired: list[ylock.events.Event] = []
    subscriber = ylock.events.subscribe(lambda e: acquired.append(e) if e.kind == ylock.events.ACQUIRED else None)
    try:
        assert a.call(a.leader.standby) is None                         # leads
        assert b.call(b.leader.standby) == 0.0                          # waited its poll: stands by
        assert a.call(a.leader.claim, "a", 1000.5, 3)
        a.call(a.leader.close)                                          # releases at once
        assert b.call(b.leader.standby) is None
        assert b.leader.token is not None and a.leader.term is None
        assert Record.loads(b.leader.records["a"]) == Record(1000.5, 3, elected[0]["token"], Record.loads(
            b.leader.records["a"]).sender)  # type: ignore[union-attr]
        assert b.call(b.leader.claim, "a", 1002.5, 4)
    finally:
        ylock.events.unsubscribe(subscriber)
        signals.beat_elected.disconnect(on_elected)
        signals.beat_stepped_down.disconnect(on_stepped)
    assert [e["terms"] for e in elected] == [1, 2]
    assert elected[1]["previous"].endswith(f"(token {elected[0]['token']})")
    assert elected[1]["token"] > elected[0]["token"]
    assert [s["reason"] for s in stepped] == ["shutting down"]
    assert [e.group for e in acquired] == ["beat", "beat"]             # each term is an acquisition: metrics count it


def test_a_leader_whose_lock_was_taken_is_refused_at_its_next_claim(two: tuple[Beat, Beat],
                                                                     local_app: Celery) -> None:
    """What a leader paused past its lease meets on resuming: the next term's fence."""
    a, b = two
    assert a.call(a.leader.standby) is None
    assert a.call(a.leader.claim, "a", 1000.0, 1)
    term = a.leader.term
    assert term is not None
    a.leader.lock.engine.force_release("beat", "global")                # a's hold is gone, as at its lease's end
    assert b.call(b.leader.standby) is None
    term.lost.clear()                                                   # a has not noticed yet (paused)
    reasons: list[str] = []

    def on_stepped(sender: str, reason: str, **kw: Any) -> None:
        reasons.append(reason)
    signals.beat_stepped_down.connect(on_stepped)
    try:
        assert not a.call(a.leader.claim, "a", 1002.0, 2)
    finally:
        signals.beat_stepped_down.disconnect(on_stepped)
    assert a.leader.term is None and "a newer term" in reasons[0]
    assert b.call(b.leader.claim, "a", 1002.0, 2)
    state = celery_ylock.beat.status(local_app)
    assert state["entries"]["a"]["token"] == b.leader.token and state["terms"] == 2


def test_an_engine_that_does_not_answer_makes_a_stand_by_wait_and_log_once(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("beat-down", broker="memory://", set_as_current=False)
    app.conf.update(ylock_url="redis://127.0.0.1:1/0?connect_timeout=0.2&socket_timeout=0.2",
                    ylock_beat={"lock": "beat", "lease": 5, "poll": 0.25})
    beat = Beat(app)
    try:
        with caplog.at_level("ERROR", logger="celery_ylock.beat"):
            waits = [beat.call(beat.leader.standby) for _ in range(2)]
        assert waits == [0.25, 0.25] and beat.leader.term is None           # not leading; ticks again after poll
        assert len([r for r in caplog.records if "cannot reach the engine" in r.getMessage()]) == 1
    finally:
        beat.thread.shutdown()


# -- the scheduler class -------------------------------------------------------------------------------


def test_it_wraps_the_configured_class(local_app: Celery, tmp_path: Any) -> None:
    scheduler = LeaderScheduler(app=local_app, schedule_filename=str(tmp_path / "s"), lazy=True)
    assert type(scheduler) is leader_class(PersistentScheduler)
    assert isinstance(scheduler, PersistentScheduler) and isinstance(scheduler, LeaderScheduler)
    assert "leader lock -> beat/global (lease 5 s; wraps celery.beat.PersistentScheduler)" in scheduler.info
    local_app.conf.ylock_beat = {"scheduler": "celery.beat:Scheduler"}
    plain = LeaderScheduler(app=local_app, lazy=True)
    assert type(plain).__mro__[1:3] == (LeaderScheduler, Scheduler)


def test_merge_takes_each_entry_s_last_run_from_the_shared_record() -> None:
    aware = ScheduleEntry("a", "t", last_run_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc))
    naive = ScheduleEntry("b", "t", last_run_at=datetime.datetime(2026, 1, 1))
    other = ScheduleEntry("c", "t", last_run_at=datetime.datetime(2026, 1, 1))
    at = 1795000000.25
    merge({"a": Record(at, 7, 1, "h:1").dumps(), "b": Record(at, 8, 1, "h:1").dumps(), "c": "not json"},
          [aware, naive, other])
    assert epoch(aware.last_run_at) == at and aware.total_run_count == 7 and aware.last_run_at.tzinfo is not None
    assert epoch(naive.last_run_at) == at and naive.last_run_at.tzinfo is None     # naive stays naive (UTC)
    assert other.last_run_at == datetime.datetime(2026, 1, 1)
    paris = datetime.timezone(datetime.timedelta(hours=1))
    assert entry_time(at, datetime.datetime(2026, 1, 1, tzinfo=paris)).utcoffset() == datetime.timedelta(hours=1)


def test_dispatch_reads_the_send_s_header() -> None:
    class Request:
        headers = {"ylock_beat": {"token": 42, "lock": "beat/global", "entry": "a", "at": 1.5, "by": "h:7"}}
    sent = celery_ylock.beat.dispatch(Request())
    assert sent == celery_ylock.beat.Dispatch(42, "beat/global", "a", 1.5, "h:7")
    assert ylock.fencing.token_of(sent) == 42                        # what the fenced helpers take

    class Plain:
        headers = None
    assert celery_ylock.beat.dispatch(Plain()) is None


# -- the settings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("beat", "message"), [
    ("beat", "app.conf.ylock_beat must be a dict"),
    ({"lok": "beat"}, "app.conf.ylock_beat has unknown key 'lok'"),
    ({"lock": ""}, "app.conf.ylock_beat['lock'] must be a non-empty string"),
    ({"lock": "bad/name"}, "lock name 'bad/name' is invalid"),
    ({"lease": -1}, "app.conf.ylock_beat['lease'] must be a number of seconds"),
    ({"poll": 0}, "app.conf.ylock_beat['poll'] must be a number of seconds > 0"),
    ({"scheduler": "nowhere.at_all:Scheduler"}, "app.conf.ylock_beat['scheduler'] = 'nowhere.at_all:Scheduler' "
                                                "cannot be imported"),
    ({"scheduler": "celery.beat:Service"}, "must be a celery.beat.Scheduler subclass"),
    ({"scheduler": "celery_ylock.beat:LeaderScheduler"}, "names celery_ylock's LeaderScheduler itself"),
])
def test_bad_settings_name_the_key(local_app: Celery, beat: Any, message: str) -> None:
    local_app.conf.ylock_beat = beat
    with pytest.raises(ylock.ConfigurationError) as caught:
        LeaderScheduler(app=local_app, lazy=True)
    assert message in str(caught.value)
    assert [message in str(p) for p in celery_ylock.checks.problems(local_app)] == [True]


def test_an_engine_that_cannot_keep_the_state_is_refused_at_the_start(local_app: Celery) -> None:
    local_app.conf.update(ylock_url="postgresql://u:p@127.0.0.1:9/db", ylock_beat=None,
                          beat_scheduler="celery_ylock.beat:LeaderScheduler")
    with pytest.raises(ylock.ConfigurationError, match=r"ylock_beat\['lock'\] = 'beat' names a lock on a postgres"):
        celery_ylock.check_app(local_app)


def test_apps_without_the_leader_scheduler_are_not_checked() -> None:
    app = Celery("plain", broker="memory://", set_as_current=False)
    app.conf.ylock_url = "local://"
    assert celery_ylock.checks.problems(app) == []


def test_the_state_s_scripts_are_package_files_that_open_with_their_contract() -> None:
    from importlib import resources
    lua = resources.files("celery_ylock.beat").joinpath("lua")
    scripts = {p.name: p.read_text() for p in lua.iterdir() if p.name.endswith(".lua")}
    assert set(scripts) == {"lead.lua", "claim.lua"}
    assert all("-- KEYS[1]" in text and "-- Returns" in text for text in scripts.values())
