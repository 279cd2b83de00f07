"""flask_ylock: ylock's distributed reentrant read-write locks for Flask.

    from flask import Flask
    from flask_ylock import YLock

    ylock = YLock()

    def create_app():
        app = Flask(__name__)
        app.config["YLOCK_URL"] = "redis://127.0.0.1:6379/0"
        ylock.init_app(app)
        return app

    @bp.post("/accounts/<int:account_id>/withdraw")
    @ylock.locked("accounts", key="account_id", timeout=1)   # 423 + Retry-After when busy
    def withdraw(account_id): ...

    @bp.post("/exports")
    @ylock.limited("exports", permits=3)                   # 3 per user at once, 429 beyond
    def export(): ...

    with ylock.lock("orders").write(timeout=5): ...
    ylock.locks("users").lock("user-42")
    with ylock.semaphores("tenants")["tenant-7"].hold(timeout=5): ...

    ylock.get_or_set(cache, "report", build_report, timeout=300)   # single-flight over Flask-Caching
    ylock_sqlalchemy.fenced_update(db.session, stmt, Account.fence, lock)  # import ylock.sqlalchemy as ylock_sqlalchemy
    ylock_sqlalchemy.fenced_update(db.session, stmt, Account.fence, flask_ylock.current_lock())  # in a @locked view

``flask ylock list|inspect|release|stats`` inspects locks; :mod:`flask_ylock.signals`
re-emits lock events as blinker signals; ``YLOCK_METRICS`` configures the exporters.
"""
from flask_ylock import cache, signals
from flask_ylock.extension import YLock, current_lock, current_user_key

__all__ = ["YLock", "signals", "cache", "current_lock", "current_user_key"]
