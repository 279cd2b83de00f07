"""celery_ylock: ylock's distributed locks around Celery tasks.

    from celery import Celery
    from celery_ylock import LockedTask

    app = Celery("proj", broker="redis://127.0.0.1:6379/1")
    app.conf.ylock_url = "redis://127.0.0.1:6379/0"          # or app.conf.ylock = {...}, or $YLOCK_URL

    @app.task(bind=True, base=LockedTask, lock={"name": "reports", "key": "{user_id}", "on_busy": "skip"})
    def build_report(self, user_id):
        token = self.request.ylock.token                     # the fencing token of this run's hold
        ...
        self.request.ylock.check()                           # raises ylock.LockLost once the hold is lost

    @app.task(base=LockedTask, lock={"name": "imports", "key": "{source}", "scope": "enqueue"})
    def import_feed(source): ...                             # import_feed.delay("x") twice: TaskLocked

See docs/celery.md: the ``lock`` option, scopes, ``on_busy``, settings and startup checks.
"""
from celery_ylock import signals
from celery_ylock.checks import check_app
from celery_ylock.hold import TaskHold, current_lock
from celery_ylock.spec import LockSpec, TaskLocked, skipped
from celery_ylock.task import LockedTask

__all__ = ["LockedTask", "LockSpec", "TaskHold", "TaskLocked", "current_lock", "skipped", "check_app", "signals"]
