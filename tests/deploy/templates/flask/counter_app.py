"""The README's Flask quick start (``app.py``, as pasted) and the deployment tests' counter
in a file (``$COUNTER_FILE``): read, think a moment, write value + 1, under the lock."""
import asyncio
import os
import threading
import time
from pathlib import Path

from app import create_app, ylock

import ylock as core
from flask_ylock.extension import request_owner

COUNTER = Path(os.environ["COUNTER_FILE"])
THINK = 0.002
LOADED = time.time()        # when this worker loaded the app

app = create_app()


def read() -> int:
    return int(COUNTER.read_text()) if COUNTER.exists() else 0


def write(value: int) -> None:
    tmp = COUNTER.with_name(f"{COUNTER.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(str(value))
    os.replace(tmp, COUNTER)


@app.post("/counter")
@ylock.locked("counter", key=False, timeout=60)
def locked():
    value = read()
    time.sleep(THINK)
    write(value + 1)
    return {"value": value + 1, "pid": os.getpid(), "owner": request_owner(), "loaded": LOADED}


@app.post("/counter/async")
@ylock.locked("counter", key=False, timeout=60)
async def locked_async():
    value = read()
    await asyncio.sleep(THINK)
    write(value + 1)
    return {"value": value + 1, "pid": os.getpid(), "owner": request_owner(), "loaded": LOADED}


@app.get("/health")
def health():
    try:
        ylock.engine().ping()
    except core.EngineUnavailable:
        return {"locks": "unavailable"}, 503
    return {"locks": "ok"}
