"""The README's Flask quick start (``app.py``, pasted with docs/metrics.md's Prometheus
line in ``create_app``) plus a locked view for the Prometheus deployment tests."""
import os

from app import create_app, ylock

app = create_app()


@app.post("/counter")
@ylock.locked("counter", key=False, timeout=60)
def locked():
    return {"pid": os.getpid()}
