"""Holds that change hands, on every engine of the contract suite: a write, read or permit hold
detached as a ticket (which survives as_dict/from_dict) and adopted once by another owner."""
from __future__ import annotations

import pytest

import ylock
from tests.contract import other, sem


@pytest.mark.parametrize("kind", ["write", "read", "permit"])
def test_a_detached_hold_is_adopted_by_another_owner(engine, group, kind):
    target = sem(engine, group, permits=1) if kind == "permit" else ylock.Lock(engine, group, "s")
    (target.acquire if kind == "permit" else target.lock if kind == "write" else target.rlock)()
    token = target.token
    ticket = target.detach()
    assert not target.held() and ticket.token == token and ticket.mode == kind
    roundtrip = type(ticket).from_dict(ticket.as_dict())

    def taken_elsewhere() -> bool:
        third = sem(engine, group, permits=1) if kind == "permit" else ylock.Lock(engine, group, "s")
        return not (third.try_acquire() if kind == "permit" else third.try_lock())

    def adopt() -> tuple[int | None, bool, bool]:
        adopted = (ylock.Semaphore if kind == "permit" else ylock.Lock).adopt(engine, roundtrip)
        result = (adopted.token, adopted.held(), other(taken_elsewhere))
        (adopted.release if kind == "permit" else adopted.unlock if kind == "write" else adopted.runlock)()
        return result
    adopted_token, held, busy = other(adopt)
    assert adopted_token == token and held and busy     # a writer waits for the read hold too
    with pytest.raises(ylock.LockLost, match="adopted already|gone"):
        ylock.Lock.adopt(engine, ticket)             # a ticket is adopted once
    assert not [i for i in engine.describe(group) if i.owners]


@pytest.mark.parametrize("kind", ["write", "permit"])
def test_the_detaching_owner_does_not_hold_the_ticket_it_handed_over(engine, group, kind):
    """Until the ticket is adopted, the hold is the ticket's: the owner that detached it
    asking again waits like anyone else (it must not be handed the ticket's hold, which the
    adopter would then share), and the adopter gets it with the detached token."""
    target = sem(engine, group, permits=1) if kind == "permit" else ylock.Lock(engine, group, "d")
    (target.acquire if kind == "permit" else target.lock)()
    token = target.token
    ticket = target.detach()
    again = target.try_acquire(0.2) if kind == "permit" else target.try_lock(0.2)
    assert again is False and target.token is None and not target.held()

    def adopt() -> int | None:
        adopted = (ylock.Semaphore if kind == "permit" else ylock.Lock).adopt(engine, ticket)
        got = adopted.token
        (adopted.release if kind == "permit" else adopted.unlock)()
        return got
    assert other(adopt) == token
    assert (target.try_acquire(5) if kind == "permit" else target.try_lock(5)) is True
    assert target.token is not None and target.token > token
    (target.release if kind == "permit" else target.unlock)()
