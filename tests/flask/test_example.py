"""The Flask example app: concurrent transfers and deposits on a real redis-server keep
every balance right; a busy account answers 423."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from tests.helpers import Runner

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from example_project.flask_app import create_app  # noqa: E402


def make_example(redis_server, group: str, tmp_path, timeout: float = 5):
    return create_app({
        "TESTING": True, "YLOCK_URL": redis_server.url, "DATABASE": str(tmp_path / "accounts.sqlite3"),
        "YLOCK_LOCKS": {"accounts": {"GROUP": group, "TIMEOUT": timeout}}, "TRANSFER_DELAY": 0.002,
    }, instance_path=str(tmp_path / "instance"))


def test_concurrent_transfers_and_deposits_keep_the_books(redis_server, live, group: str, tmp_path) -> None:
    app = make_example(redis_server, group, tmp_path)
    server = live(app)

    def post(path: str, body: dict) -> int:
        return server.request("POST", path, {"Content-Type": "application/json"}, data=json.dumps(body).encode())[0]

    def transfers(seed: int) -> list[int]:
        rng = random.Random(seed)
        out = []
        for _ in range(15):
            source, target = rng.sample([1, 2, 3], 2)
            out.append(post("/transfer", {"from": source, "to": target, "amount": rng.randrange(1, 50)}))
        return out

    def deposits() -> list[int]:
        return [post("/accounts/1/deposit", {"amount": 1}) for _ in range(15)]

    runners = [Runner(lambda s=s: transfers(s)) for s in range(4)] + [Runner(deposits) for _ in range(2)]
    for r in runners:
        r.start()
    statuses = [status for r in runners for status in r.outcome(60)]
    assert set(statuses) <= {200, 409} and statuses.count(200) >= 60
    books = json.loads(server.request("GET", "/accounts")[2])
    assert books["total"] == 3000 + 30   # no lost update: every deposit and transfer counted
    status, _, body = server.request("GET", "/accounts/1")
    assert status == 200 and json.loads(body)["balance"] == books["accounts"]["1"]


def test_a_busy_account_answers_423(redis_server, live, group: str, tmp_path) -> None:
    app = make_example(redis_server, group, tmp_path, timeout=0.1)
    from example_project.flask_app import ylock
    with app.app_context():
        family = ylock.locks("accounts")
    server = live(app)
    with family.write("2"):
        status, headers, _ = server.request("POST", "/transfer", {"Content-Type": "application/json"},
                                            data=b'{"from": 1, "to": 2, "amount": 5}')
        assert status == 423 and headers["Retry-After"] == "1"
        assert server.request("GET", "/accounts/2")[0] == 423
        assert server.request("GET", "/accounts/1")[0] == 200
    assert server.request("GET", "/accounts/2")[0] == 200
