"""What the cross-process tests (tests/web/test_limited.py) serve with gunicorn: the same
views in a Flask app and a Django project, each parking its request at the test's gate.

A view that got its permit (or lock) connects to the test's gate (``$YLOCK_TEST_GATE``, a
port of 127.0.0.1), says which key it holds and its pid, and returns only when the test
answers: the test decides how long each request stays in flight, without sleeps.
"""
from __future__ import annotations

import os
import socket

#: Seconds a parked view waits for the test before it gives up (a test that died).
PARKED = 30.0


def park(key: str) -> None:
    """Tell the test this request is in flight holding ``key``; return once it says "go"."""
    with socket.create_connection(("127.0.0.1", int(os.environ["YLOCK_TEST_GATE"])), timeout=PARKED) as conn:
        conn.sendall(f"{key} {os.getpid()}\n".encode())
        if conn.recv(2) != b"go":
            raise RuntimeError(f"the test closed the gate of {key} without letting it go")


def create_flask_app() -> object:
    """The Flask app (gunicorn 'tests.web.served:create_flask_app()')."""
    from flask import Flask, jsonify

    from flask_ylock import YLock

    app = Flask("served", instance_path=os.environ["YLOCK_TEST_INSTANCE"])
    app.config.update(SECRET_KEY="served", YLOCK_URL=os.environ["YLOCK_TEST_URL"],
                      YLOCK_LOCKS={"exports": {"PERMITS": 2}})
    ext = YLock(app)

    @app.post("/exports/<tenant>")
    @ext.limited("exports", key="tenant")          # PERMITS from YLOCK_LOCKS
    def export(tenant: str) -> object:
        park(f"exports/{tenant}")
        return jsonify(exported=tenant)

    @app.post("/accounts/<tenant>")
    @ext.locked("accounts", key="tenant")
    def account(tenant: str) -> object:
        park(f"accounts/{tenant}")
        return jsonify(locked=tenant)
    return app
