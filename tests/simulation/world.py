"""The simulated world: one Redis server (the model, running the real scripts), a network
between it and a few processes, a virtual clock, and a nemesis, all drawn from one seed.

It is a discrete-event simulation: an event queue ordered by (time, sequence); each
event resumes one process's task (its lock program or its watchdog) with the answer to
the operation it asked for, and the task runs until it asks for the next one. Nothing
reads a real clock and every choice comes from the schedule's ``random.Random(seed)``, so a
seed replays exactly.

Faults, each drawn from the seed: a reply dropped (the script ran, the client never heard:
it times out), a reply late (within or past the socket timeout), a process paused (past
its lease, or not), a process crashed (its holds and queue entries left behind), the
server's clock jumping (ahead, or back), and a failover that promotes a replica without the
last writes, with the replica's own clock (within ``skew`` of the old master's).
"""
from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from tests.simulation.client import (
    CLOCK,
    BlockingPop,
    LocalProtocol,
    LocalWait,
    Pause,
    Process,
    RedisProtocol,
    RenewBatch,
    Script,
    SimPolling,
    Ticket,
    WatchdogSleep,
    virtual_time,
)
from tests.simulation.history import Acquisition, History, HoldRecord, Try
from tests.simulation.lua import ScriptError, ScriptHost, fmt_args
from tests.simulation.model import Keyspace
from tests.simulation.programs import GROUP, LOCK, SEMAPHORE, US, Programs
from ylock.errors import EngineUnavailable, LockError


@dataclass
class Config:
    """One schedule's shape, drawn from its seed (:meth:`draw`)."""

    seed: int
    engine: str = "redis"
    processes: int = 4
    rounds: int = 4
    locks: tuple[str, ...] = ("a",)
    fair: tuple[bool, ...] = (True,)
    semaphore: bool = False
    permits: int = 2
    lease: float = 3.0
    socket_timeout: float = 0.5
    poll_max: float = 0.5
    p_drop: float = 0.0
    p_late: float = 0.0
    pauses: int = 0
    crashes: int = 0
    jumps: int = 0
    failovers: int = 0
    skew: float = 0.0          # a promoted replica's clock, within this many seconds of the master's
    failover_time: float = 1.5
    horizon: float = 90.0      # world seconds; a schedule still running then is stuck
    force_releases: int = 0    # an operator force-releases lock "a" (or the semaphore)
    exact: bool = True         # a simulated schedule (False: real processes, see tests.simulation.processes)

    @classmethod
    def draw(cls, seed: int, engine: str = "redis") -> Config:
        rng = random.Random(f"config:{seed}")
        redis = engine == "redis"
        locks = ("a", "b")[:rng.choice((1, 1, 2))]
        return cls(
            seed=seed, engine=engine,
            processes=rng.randint(2, 5), rounds=rng.randint(2, 4),
            locks=locks, fair=tuple(rng.random() < 0.6 for _ in locks),
            semaphore=rng.random() < 0.3, permits=rng.randint(1, 3),
            lease=rng.choice((1.5, 3.0, 6.0)), socket_timeout=rng.choice((0.2, 0.5)),
            poll_max=rng.choice((0.1, 0.3, 0.5)),
            p_drop=rng.choice((0.0, 0.02, 0.08, 0.2)) if redis else 0.0,
            p_late=rng.choice((0.0, 0.05, 0.15)) if redis else 0.0,
            # (a thread of the local engine's one process neither dies nor stops alone)
            pauses=rng.choice((0, 0, 1, 2)) if redis else 0, crashes=rng.choice((0, 0, 1)) if redis else 0,
            jumps=rng.choice((0, 0, 1)) if redis else 0,
            failovers=(1 if rng.random() < 0.15 else 0) if redis else 0,
            skew=rng.choice((0.0, 0.05, 0.5)), failover_time=rng.choice((1.0, 2.0)),
            force_releases=1 if rng.random() < 0.1 else 0,
        )


class _Task:
    __slots__ = ("proc", "gen", "waiting", "sleep_until", "name", "call")

    def __init__(self, proc: _Proc, gen: Generator[Any, Any, Any], name: str) -> None:
        self.proc = proc
        self.gen: Generator[Any, Any, Any] | None = gen
        self.name = name
        self.waiting: Any = None        # the operation it waits on
        self.sleep_until: float | None = None
        self.call: _Call | None = None


class _Proc:
    def __init__(self, world: World, index: int, process: Process, rng: random.Random) -> None:
        self.world = world
        self.name = process.name
        self.process = process
        self.rng = rng
        # its monotonic clock's origin (the local engine's "processes" are threads of one process)
        self.offset = rng.uniform(100.0, 10_000.0) if world.config.engine == "redis" else 1000.0
        self.paused_until: float | None = None
        self.crashed = False
        self.deferred: list[tuple[_Task, Any, BaseException | None]] = []
        self.tasks: list[_Task] = []
        self.current: Acquisition | None = None
        self.serial = 1
        self.owner = process.owner(1)
        #: ((owner, lock, mode), renewals) while an adoption is under way
        self.adopting: tuple[tuple[str, tuple[str, str], str], list[Any]] | None = None

    def clock(self) -> float:
        return self.world.now / US + self.offset


class _Call:
    __slots__ = ("id", "task", "op", "sent", "settled", "epoch", "attempt", "timeout")

    def __init__(self, id: int, task: _Task, op: Any, sent: int, epoch: int, timeout: int) -> None:
        self.id = id
        self.task = task
        self.op = op
        self.sent = sent
        self.timeout = timeout          # µs from sent: when the client gives up on it
        self.settled = False
        self.epoch = epoch
        self.attempt: Try | None = None


class Server:
    """The Redis model as one server process: its keyspace, its clock (world time plus an
    offset), whether it serves, and the replication stream a failover promotes a prefix of."""

    def __init__(self, host: ScriptHost | None) -> None:
        self.host = host
        self.keyspace = Keyspace()
        self.offset = 1_700_000_000 * US
        self.up = True
        self.epoch = 0
        self.stream: list[tuple[int, Keyspace]] = []     # (call id, keyspace after it), the last few
        self.blocked: dict[bytes, list[tuple[_Call, int]]] = {}


class World(Programs):
    """One schedule (see the module docstring): ``World(Config.draw(seed)).run()`` returns its
    :class:`History`."""

    def __init__(self, config: Config, host: ScriptHost | None = None, trace: bool = False) -> None:
        self.config = c = config
        #: With ``trace``: what happened, line by line (printed for a failing seed).
        self.trace: list[str] | None = [] if trace else None
        self.rng = random.Random(f"world:{c.seed}")
        self.now = 0
        self.events: list[tuple[int, int, Any, tuple[Any, ...]]] = []
        self.seq = itertools.count()
        self.call_ids = itertools.count(1)
        self.history = History()
        self.tickets: list[tuple[Ticket, int]] = []      # a detached hold's ticket, its record's id
        if c.engine == "redis":
            self.protocol: Any = RedisProtocol(c.socket_timeout)
            self.server = Server(host or ScriptHost(self.protocol.sources()))
        else:
            self.protocol = LocalProtocol()
            self.protocol.on_renew = self._record_local_renewals
            self.server = Server(None)
        self.polling = SimPolling(initial=min(0.05, c.poll_max), maximum=c.poll_max, seed=c.seed)
        self.procs: list[_Proc] = []
        self.holds: dict[int, HoldRecord] = {}          # id(Hold) -> its open record
        self.acq_ids = itertools.count(1)
        self.hold_ids = itertools.count(1)
        self.steps = 0
        self.running: _Proc | None = None        # the process whose task runs now
        self.programs = c.processes                # programs still running (not done, not crashed)
        if c.semaphore:
            self.history.permits["s"] = c.permits

    # -- the event loop -------------------------------------------------------------------

    def at(self, when: int, fn: Any, *args: Any) -> None:
        heapq.heappush(self.events, (when, next(self.seq), fn, args))

    def run(self) -> History:
        c = self.config
        with virtual_time():
            for i in range(c.processes):
                rng = random.Random(f"proc:{c.seed}:{i}")
                process = Process(f"p{i}", self.protocol, c.lease, self.polling, self._lost)
                proc = _Proc(self, i, process, rng)
                self.procs.append(proc)
                main = _Task(proc, self._program(proc), "main")
                dog = _Task(proc, process.watchdog(), "watchdog")
                proc.tasks = [main, dog]
                self.at(int(rng.uniform(0, 0.2) * US), self._resume, main, None, None)
                self.at(0, self._resume, dog, None, None)
            self._nemesis()
            horizon = int(c.horizon * US)
            while self.events:
                when, _, fn, args = heapq.heappop(self.events)
                if when > horizon:
                    self.history.errors.append(f"stuck: still running at the horizon ({c.horizon} s)")
                    break
                self.now = when
                fn(*args)
                self.steps += 1
                if self.steps > 400_000:
                    self.history.errors.append("runaway: more than 400000 events")
                    break
                if not self.programs:        # every program finished or crashed
                    break
        self.history.end = self.now / US
        for record in self.holds.values():
            if record.end is None:
                record.end, record.why = self.now / US, "end"
        return self.history

    # -- tasks ----------------------------------------------------------------------------

    def _resume(self, task: _Task, value: Any, exc: BaseException | None) -> None:
        proc = task.proc
        if proc.crashed or task.gen is None:
            return
        if proc.paused_until is not None:
            # Its wake-up is taken (no other may be scheduled for it: a watchdog woken by a
            # timer during the pause and again by a renewal scheduled after it would read
            # its next call's answer from the second wake-up).
            task.waiting = None
            proc.deferred.append((task, value, exc))
            return
        task.waiting = task.sleep_until = task.call = None
        self.running = proc
        CLOCK.set(proc.clock())
        try:
            op = task.gen.send(value) if exc is None else task.gen.throw(exc)
        except StopIteration:
            task.gen = None
            if task.name == "main":
                self.programs -= 1
            op = None
        except Exception as error:  # noqa: BLE001 - a client error is a finding
            task.gen = None
            if task.name == "main":
                self.programs -= 1
            op = None
            self.history.errors.append(f"{proc.name}/{task.name} at {self.now / US:.6f}: {error!r}")
        finally:
            CLOCK.set(None)
        if op is not None:
            self._dispatch(task, op)
        self._after_step(proc)

    def _after_step(self, proc: _Proc) -> None:
        # The watchdog's Condition: a renewal scheduled before it means to wake wakes it.
        dog = proc.tasks[1] if len(proc.tasks) > 1 else None
        if dog is not None and isinstance(dog.waiting, WatchdogSleep):
            until = dog.sleep_until
            if proc.process.table.wake_at < (float("inf") if until is None else until):
                dog.waiting = None
                self.at(self.now, self._resume, dog, None, None)
        if self.config.engine == "local":
            for other in self.procs:
                for task in other.tasks:
                    if isinstance(task.waiting, LocalWait) and task.waiting.mailbox._events:
                        mailbox = task.waiting.mailbox
                        task.waiting = None
                        self.at(self.now, self._wake_local, task, mailbox)

    def _wake_local(self, task: _Task, mailbox: Any) -> None:
        self._resume(task, mailbox.take(), None)

    def _dispatch(self, task: _Task, op: Any) -> None:
        task.waiting = op
        proc = task.proc
        if isinstance(op, (Script, RenewBatch, BlockingPop)):
            self._send(task, op)
        elif isinstance(op, Pause):
            self.at(self.now + max(0, math.ceil(op.seconds * US)), self._timer, task, op)
        elif isinstance(op, WatchdogSleep):
            task.sleep_until = op.until
            if op.until is not None:
                self.at(self.now + max(1, math.ceil((op.until - proc.clock()) * US)), self._timer, task, op)
        elif isinstance(op, LocalWait):
            if op.mailbox._events:
                self.at(self.now, self._wake_local, task, op.mailbox)
                task.waiting = None
            elif op.until is not None:
                self.at(self.now + max(1, math.ceil((op.until - proc.clock()) * US)), self._timer, task, op)
        else:
            raise AssertionError(f"unknown operation {op!r}")

    def _timer(self, task: _Task, op: Any) -> None:
        if task.waiting is op:
            if isinstance(op, LocalWait):
                self._resume(task, op.mailbox.take(), None)
            else:
                self._resume(task, None, None)

    # -- the network ----------------------------------------------------------------------

    def _latency(self) -> int:
        return int(self.rng.uniform(50, 600))

    def _send(self, task: _Task, op: Any) -> None:
        proc = task.proc
        timeout = max(0, math.ceil((op.end - proc.clock()) * US))     # the call's bound, on its clock
        call = _Call(next(self.call_ids), task, op, self.now, self.server.epoch, timeout)
        task.call = call
        if isinstance(op, Script) and op.name in ("acquire", "sem_acquire") and proc.current is not None \
                and task.name == "main":
            call.attempt = Try(self.now / US, str(op.args[2]), call=call.id, first=op.first)
            proc.current.tries.append(call.attempt)
        self.at(self.now + self._latency(), self._arrive, call)
        self.at(self.now + timeout, self._timeout, call)

    def _timeout(self, call: _Call) -> None:
        if call.settled:
            return
        call.settled = True
        self.note(f"{call.task.proc.name} timed out call {call.id} ({type(call.op).__name__})")
        if isinstance(call.op, BlockingPop):     # the client closes the connection: unblocked
            self._unblock(call)
        if isinstance(call.op, RenewBatch):
            self._record_renewals(call, None)
        self._resume(call.task, None, EngineUnavailable("Redis did not answer in time (simulated)"))

    def _reply(self, call: _Call, value: Any, exc: BaseException | None) -> None:
        if call.settled:
            return
        call.settled = True
        if call.attempt is not None and exc is None:
            call.attempt.done = self.now / US
            call.attempt.status = 1 if value.__class__ is int else int(value[0])
        if isinstance(call.op, RenewBatch):
            self._record_renewals(call, value)
        if self.trace is not None:
            self.note(f"{call.task.proc.name} got call {call.id} ({type(call.op).__name__}): "
                      f"{value if exc is None else exc!r}")
        self._resume(call.task, value, exc)

    def _answer(self, call: _Call, value: Any, exc: BaseException | None = None) -> None:
        """Send the server's answer back: on time, late, or never (dropped)."""
        c = self.config
        if exc is None and self.rng.random() < c.p_drop:
            self.note(f"dropped the answer to call {call.id}")
            return
        delay = self._latency()
        if self.rng.random() < c.p_late:
            delay += int(self.rng.uniform(0, 1.3) * call.timeout)
            self.note(f"the answer to call {call.id} is late by {delay / US:.6f} s")
        self.at(self.now + delay, self._reply, call, value, exc)

    def _arrive(self, call: _Call) -> None:
        server = self.server
        if call.task.proc.crashed:
            return
        if not server.up or call.epoch != server.epoch:
            self._answer(call, None, EngineUnavailable("connection refused (simulated)"))
            return
        op = call.op
        if isinstance(op, BlockingPop):
            key = op.key.encode()
            server.keyspace.now_ms = (self.now + server.offset) // 1000
            got = server.keyspace.blpop_now(key)
            self.note(f"{call.task.proc.name} call {call.id} BLPOP {op.key} {op.block:.6f}: {got}")
            if got is not None:
                self._answer(call, got)
                return
            until = self.now + int(op.block * US)
            server.blocked.setdefault(key, []).append((call, until))
            self.at(until, self._pop_timeout, call, key)
            return
        if isinstance(op, RenewBatch):
            replies = []
            for renew_keys, args in op.calls:
                try:
                    replies.append(self._run_script("renew", renew_keys, args, call))
                except ScriptError as exc:
                    replies.append(exc)
            self._answer(call, replies)
            return
        try:
            reply = self._run_script(op.name, op.keys, op.args, call)
        except ScriptError as exc:
            self.history.errors.append(f"script {op.name} failed: {exc}")
            self._answer(call, None, LockError(str(exc)))
            return
        self._answer(call, reply)

    def _run_script(self, name: str, keys: tuple[str, ...], args: tuple[Any, ...], call: _Call) -> Any:
        server = self.server
        assert server.host is not None
        try:
            reply = server.host.run(name, server.keyspace, self.now + server.offset, [k.encode() for k in keys],
                                    fmt_args(list(args)))
        finally:
            if self.trace is not None:
                self.note(f"{call.task.proc.name} call {call.id} {name} {keys[0]} {args}")
        if self.trace is not None:
            self.note(f"  -> {reply!r}")
        if self.config.failovers:        # (the replication stream a failover promotes a prefix of)
            server.stream.append((call.id, server.keyspace.copy()))
            if len(server.stream) > 6:
                del server.stream[0]
        self._serve_blocked()
        return reply

    def _serve_blocked(self) -> None:
        server = self.server
        for key in [k for k, v in server.blocked.items() if v]:
            waiting = server.blocked[key]
            while waiting:
                got = server.keyspace.blpop_now(key)
                if got is None:
                    break
                call, _ = waiting.pop(0)
                self.note(f"{call.task.proc.name} call {call.id} BLPOP served: {got}")
                self._answer(call, got)

    def _pop_timeout(self, call: _Call, key: bytes) -> None:
        waiting = self.server.blocked.get(key, [])
        for i, (c, _) in enumerate(waiting):
            if c is call:
                del waiting[i]
                self._answer(call, None)
                return

    def _unblock(self, call: _Call) -> None:
        for waiting in self.server.blocked.values():
            waiting[:] = [(c, u) for c, u in waiting if c is not call]

    # -- the nemesis ----------------------------------------------------------------------

    def _nemesis(self) -> None:
        c = self.config
        span = 3.0 + c.rounds * 2.0
        for _ in range(c.pauses):
            self.at(int(self.rng.uniform(0.2, span) * US), self._pause, self.rng.randrange(c.processes),
                    self.rng.choice((0.3, 1.0, 2.0)) * c.lease)
        for _ in range(c.crashes):
            self.at(int(self.rng.uniform(0.5, span) * US), self._crash, self.rng.randrange(c.processes))
        for _ in range(c.jumps):
            jump = self.rng.choice((-2.0, -0.5, 0.2 * c.lease / 3))
            self.at(int(self.rng.uniform(0.5, span) * US), self._jump, jump)
        for _ in range(c.failovers):
            self.at(int(self.rng.uniform(1.0, span) * US), self._failover)
        for _ in range(c.force_releases):
            lock = (SEMAPHORE, "s") if c.semaphore and self.rng.random() < 0.3 else (LOCK, "a")
            self.at(int(self.rng.uniform(0.5, span) * US), self._force_release, lock)

    def _force_release(self, lock: tuple[str, str]) -> None:
        """An operator's ``force_release`` (``ylock release``), on the server itself."""
        kind, name = lock
        self.note(f"NEMESIS force-release {name}")
        self.history.forced.append((self.now / US, lock))
        if self.config.engine == "local":
            CLOCK.set(self.now / US + self.procs[0].offset)
            try:
                self.protocol.engine.force_release(GROUP, name, kind)
            finally:
                CLOCK.set(None)
            self._after_step(self.procs[0])
            return
        server = self.server
        if not server.up:
            return
        assert server.host is not None
        script, keys = self.protocol.force_release_call(GROUP, name, kind)
        server.host.run(script, server.keyspace, self.now + server.offset, [k.encode() for k in keys], [])
        if self.config.failovers:
            server.stream.append((0, server.keyspace.copy()))
        self._serve_blocked()

    def _pause(self, index: int, seconds: float) -> None:
        proc = self.procs[index]
        if proc.crashed or proc.paused_until is not None:
            return
        proc.paused_until = self.now + int(seconds * US)
        self.note(f"NEMESIS pause {proc.name} for {seconds} s")
        self.history.pauses.append((proc.name, self.now / US, proc.paused_until / US))
        self.at(proc.paused_until, self._unpause, proc)

    def _unpause(self, proc: _Proc) -> None:
        proc.paused_until = None
        deferred, proc.deferred = proc.deferred, []
        for task, value, exc in deferred:
            self.at(self.now, self._resume, task, value, exc)

    def _crash(self, index: int) -> None:
        proc = self.procs[index]
        if proc.crashed:
            return
        proc.crashed = True
        if proc.tasks[0].gen is not None:
            self.programs -= 1
        self.note(f"NEMESIS crash {proc.name}")
        self.history.crashes[proc.name] = self.now / US
        for key, record in list(self.holds.items()):
            if record.proc == proc.name:
                self._close_key(key, "crash")
        for task in proc.tasks:
            if task.call is not None and isinstance(task.call.op, BlockingPop):
                self._unblock(task.call)

    def _jump(self, seconds: float) -> None:
        self.server.offset += int(seconds * US)
        self.note(f"NEMESIS server clock jumps {seconds} s")
        self.history.jumps.append((self.now / US, seconds))

    def _failover(self) -> None:
        server = self.server
        if not server.up:
            return
        server.up = False
        server.epoch += 1
        start = self.now
        for waiting in server.blocked.values():       # their connections reset
            for call, _ in waiting:
                self._answer(call, None, EngineUnavailable("connection reset (simulated)"))
        server.blocked.clear()
        lost_n = self.rng.randint(0, min(3, len(server.stream)))
        kept = server.stream[:len(server.stream) - lost_n] if lost_n else server.stream
        lost = {call_id for call_id, _ in server.stream[len(server.stream) - lost_n:]} if lost_n else set()
        promoted = kept[-1][1].copy() if kept else (Keyspace() if lost_n else server.keyspace.copy())
        skew = int(self.rng.uniform(-self.config.skew, self.config.skew) * US)
        down = int(self.config.failover_time * US)
        self.history.failovers.append((start / US, (start + down) / US, lost))
        self.note(f"NEMESIS failover: down {down / US} s, losing calls {sorted(lost)}, skew {skew / US} s")
        self.at(start + down, self._promote, promoted, skew)

    def _promote(self, keyspace: Keyspace, skew: int) -> None:
        server = self.server
        server.keyspace = keyspace
        server.offset += skew
        server.stream = []
        server.up = True
        if skew:
            # The promoted server's clock is the old one's plus the skew: to every lease, a jump.
            self.history.jumps.append((self.now / US, skew / US))

def simulate(seed: int, engine: str = "redis", host: ScriptHost | None = None,
             trace: list[str] | None = None) -> tuple[Config, History]:
    """Run the schedule of ``seed``; with ``trace`` (a list), append what happened to it."""
    config = Config.draw(seed, engine)
    world = World(config, host, trace=trace is not None)
    history = world.run()
    if trace is not None and world.trace is not None:
        trace.extend(world.trace)
    return config, history


__all__ = ["Config", "Server", "World", "simulate", "LOCK", "SEMAPHORE"]
