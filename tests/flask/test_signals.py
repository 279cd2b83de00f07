"""Blinker signals re-emit the core events, with the current app as sender."""
from __future__ import annotations

from flask_ylock import signals
from tests.flask.conftest import Gate
from tests.helpers import Runner


def test_signals_carry_the_event_and_the_app(make_app, live, gate: Gate, group: str) -> None:
    app, ext = make_app()

    @app.post("/pay/<int:account_id>")
    @ext.locked("accounts", key="account_id", timeout=0.05)
    def pay(account_id: int) -> str:
        gate.pass_through()
        return "paid"

    received: list[tuple[str, object, object]] = []

    def receiver(name: str):
        def on_signal(sender, event) -> None:
            if event.group == group:
                received.append((name, sender, event))
        return on_signal

    handlers = {name: receiver(name) for name in ("acquired", "timed_out", "released")}
    signals.lock_acquired.connect(handlers["acquired"])
    signals.lock_timed_out.connect(handlers["timed_out"])
    signals.lock_released.connect(handlers["released"], sender=app)   # only this app's
    try:
        server = live(app)
        first = Runner(lambda: server.request("POST", "/pay/1"))
        first.start()
        assert gate.entered.wait(10)
        assert server.request("POST", "/pay/1")[0] == 423
        gate.leave.set()
        assert first.outcome()[0] == 200
    finally:
        signals.lock_acquired.disconnect(handlers["acquired"])
        signals.lock_timed_out.disconnect(handlers["timed_out"])
        signals.lock_released.disconnect(handlers["released"])
    kinds = [name for name, _, _ in received]
    assert kinds == ["acquired", "timed_out", "released"]
    assert all(sender is app for _, sender, _ in received)
    _, _, timed_out = received[1]
    assert timed_out.name == "1" and timed_out.mode == "write" and timed_out.wait >= 0.05
    _, _, released = received[2]
    assert released.hold is not None and released.hold >= timed_out.wait
