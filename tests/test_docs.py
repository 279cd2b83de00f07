"""The README and the documentation site as a reader meets them.

- ``mkdocs build --strict`` passes (a broken link, anchor or nav entry, or an API
  reference entry mkdocstrings cannot render, fails the build);
- the README stays short (at most 15 KB: the rest lives in ``docs/``);
- every relative link of README.md and docs/*.md resolves: the file exists, and a
  ``#anchor`` names one of its headings; nothing external is fetched;
- every Python block of README.md and docs/*.md is exercised: a runnable block runs as
  pasted in a fresh interpreter (the only change: ``redis://127.0.0.1:6379`` becomes the
  test session's redis-server), a block marked ``<!-- fragment -->`` (it continues an
  earlier block) is type-checked with ``mypy --strict`` after a prelude that defines what it
  continues, every other block is type-checked too (as pasted), and the blocks that other tests run as
  files of a project (the quick starts, the testing guide, the Prometheus set-up) are listed in ``ELSEWHERE`` with
  the test that runs them;
- the shell blocks' ``ylock`` command lines name verbs and options the console script has.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_LIMIT = 15 * 1024

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"<!--\s*(fragment)\b[^>]*-->\s*\Z")

#: Blocks other tests run as files of a user's project, by (page, first line): the test file
#: that runs them and what it must say (the block's first line, the page) to be that test.
ELSEWHERE: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    ("README.md", "# settings.py"): ("tests/deploy/helpers.py", ('"# settings.py"', "Django quick start")),
    ("README.md", "# views.py"): ("tests/deploy/helpers.py", ('"# views.py"', "Django quick start")),
    ("README.md", "# app.py"): ("tests/deploy/test_readme.py", ('"# app.py"', "Flask quick start")),
    ("docs/deployment.md", "# health.py"): ("tests/deploy/helpers.py", ('"# health.py"', '"deployment.md"')),
    ("docs/flask.md", "from flask import Blueprint, Flask"): ("tests/deploy/test_readme.py",
                                                             ('"flask.md"', '"def create_app"')),
    **{("docs/testing.md", f"# {name}"): ("tests/test_pytest_plugin.py", (f'"# {name}"', "docs/testing.md"))
       for name in ("views.py", "test_views.py", "app.py", "test_app.py", "tasks.py", "test_tasks.py")},
    **{("docs/metrics.md", f"# {name}"): ("tests/deploy/test_prometheus.py", (f'"# {name}"', '"metrics.md"'))
       for name in ("settings.py", "urls.py", "app.py", "gunicorn.conf.py")},
}

#: Blocks of pages this suite does not own the markup of, classified here instead of by a
#: marker: ("fragment", prelude) or ("entry", prelude): a dict entry, checked inside braces.
CLASSIFIED: dict[tuple[str, str], str] = {
    ("docs/testing.md", "# settings.py"): "fragment",
    ("docs/metrics.md", '"METRICS": {'): "entry",
}

#: What the fragments of a page continue (the names its earlier blocks define), typed.
PRELUDE = '''\
from __future__ import annotations
import environ
import ylock
engine: ylock.Engine = ylock.engine_from_url("local://")
orders = ylock.Lock(engine, group="orders", name="global", fair=True, lease=30.0)
users = ylock.Locks(engine, group="users", lease=30.0)
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
env = environ.Env()
'''
#: What a standalone README block is pasted after (the settings a new Django project has).
STANDALONE = '''\
from __future__ import annotations
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
'''
PRELUDES = {
    "docs/fencing.md": '''\
from __future__ import annotations
from celery import Celery
from flask import Flask
from flask_ylock import YLock
from sqlalchemy.orm import DeclarativeBase, Session
app = Celery("tasks")
class Base(DeclarativeBase): ...
ylock_ext = YLock()
flask_app = Flask(__name__)
db_session = Session()
''',
    "docs/flask.md": '''\
from __future__ import annotations
from flask import Blueprint, Flask
from flask_ylock import YLock
ylock = YLock()
app = Flask(__name__)
bp = Blueprint("bp", __name__)
''',
}

#: What a block appended to a project's file follows there: (page, first line) -> prelude.
PASTED_AFTER = {
    ("docs/metrics.md", "# settings.py"): STANDALONE + "from typing import Any\nYLOCK: dict[str, Any] = {}\n",
    ("docs/metrics.md", "# urls.py"): "from __future__ import annotations\nfrom typing import Any\n"
                                      "from django.urls import path\nurlpatterns: list[Any] = []\n",
    ("docs/metrics.md", "# app.py"): "from __future__ import annotations\nfrom flask import Flask\n"
                                     "app = Flask(__name__)\n",
}

MYPY_CONFIG = """\
[mypy]
strict = True
# prometheus_client's multiprocess helpers (the gunicorn hooks' mark_process_dead) have no
# annotations: calling them is the block's only choice
untyped_calls_exclude = prometheus_client
# Django, Celery and the drivers are untyped without stub packages: their decorators and base
# classes are Any. What is checked is what a block does with ylock's own (typed) API.
ignore_missing_imports = True
disallow_subclassing_any = False
disallow_untyped_decorators = False
[mypy-ylock.*,django_ylock.*,flask_ylock.*,celery_ylock.*]
# the packages' own checks are tox's; here only the blocks' errors count
follow_imports = silent
"""


@dataclass(frozen=True)
class Block:
    page: str           # relative to the root, e.g. "docs/flask.md"
    line: int           # of the opening fence
    code: str
    kind: str           # "run", "fragment", "entry" or "elsewhere"

    @property
    def first_line(self) -> str:
        return self.code.splitlines()[0] if self.code else ""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _classify(page: str, before: str, code: str) -> str:
    first = code.splitlines()[0] if code else ""
    for (p, start), _ in ELSEWHERE.items():
        if p == page and first.startswith(start):
            return "elsewhere"
    for (p, start), kind in CLASSIFIED.items():
        if p == page and first.startswith(start):
            return kind
    if MARKER.search(before):
        return "fragment"
    return "run"


def python_blocks() -> list[Block]:
    blocks = []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        page = path.relative_to(ROOT).as_posix()
        for match in FENCE.finditer(text):
            if match.group(1) != "python":
                continue
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            blocks.append(Block(page, text[:match.start()].count("\n") + 1, match.group(2),
                                _classify(page, before, match.group(2))))
    return blocks


BLOCKS = python_blocks()


# -- the site -----------------------------------------------------------------------------------


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-5000:] + built.stderr[-5000:]
    # the API reference rendered the docstrings (the one source), and the changelog came in
    api = (site / "api" / "ylock" / "index.html").read_text(encoding="utf-8")
    for text in ("try_lock", "Acquire the write lock", "LockTimeout", "all_of", "Ticket", "guard", "FencedOut",
                 "fenced_update", "get_or_set", "register_scheme", "child_exit"):
        assert text in api, text
    assert ":class:" not in api and "::</p>" not in api                 # reST read as Markdown
    engines = (site / "api" / "engines" / "index.html").read_text(encoding="utf-8")
    for name in ("RedisEngine", "ZooKeeperEngine", "PostgresEngine", "LocalEngine"):
        assert name in engines, name
    for page, name in (("django", "locked"), ("django", "FenceField"), ("django", "get_or_set"), ("flask", "YLock"),
                       ("flask", "get_or_set"), ("celery", "LockedTask"), ("testing", "ylock_django"),
                       ("testing", "LocalTestEngine")):
        assert name in (site / "api" / page / "index.html").read_text(encoding="utf-8"), (page, name)
    assert "0.1.0" in (site / "changelog" / "index.html").read_text(encoding="utf-8")
    # Every mounted repository file is in the site, and every page that links it (by its path in
    # the repository) shows the site's copy: no image of a built page points outside the site.
    for site_path, repo_path in _mounted().items():
        assert (site / site_path).read_bytes() == (ROOT / repo_path).read_bytes()
    for html in site.rglob("*.html"):
        for src in re.findall(r'<img[^>]* src="([^"]+)"', html.read_text(encoding="utf-8")):
            if not re.match(r"[a-z][a-z0-9+.-]*:", src):
                assert (html.parent / src).resolve().is_file(), f"{html.relative_to(site)}: broken image {src}"
    benchmarks = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert 'src="../bench/latest.png"' in benchmarks


def test_the_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes (at most {README_LIMIT}): move detail into docs/"


# -- links ----------------------------------------------------------------------------------------


def _mounted() -> dict[str, str]:
    """The repository files docs/hooks.py shows in the site: site path -> repository path."""
    spec = importlib.util.spec_from_file_location("_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.MOUNTED)


def _prose(text: str) -> str:
    """``text`` without its code blocks and code spans (a link in code is not a link)."""
    text = FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def _slugs(text: str) -> set[str]:
    """The anchors of a Markdown text's headings, as MkDocs (Python-Markdown's toc) and
    GitHub make them (the README is read on GitHub, the pages on the site)."""
    slugs = set()
    for match in re.finditer(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", text), re.M):
        heading = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", match.group(1))
        ascii_ = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
        slugs.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_).strip().lower()))
        slugs.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return slugs


def _text_of(path: Path) -> str:
    """A page's Markdown with the files it includes (``--8<-- "FILE"`` snippets)."""
    text = path.read_text(encoding="utf-8")
    return re.sub(r'^--8<-- "([^":]+)(?::[\w-]+)?"$', lambda m: (ROOT / m.group(1)).read_text(encoding="utf-8"),
                  text, flags=re.M)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path: Path) -> None:
    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _prose(path.read_text(encoding="utf-8")))
    broken = []
    for link in links:
        if re.match(r"[a-z][a-z0-9+.-]*:", link):         # http:, https:, mailto: not fetched
            continue
        target, _, anchor = link.partition("#")
        if target:
            relative = (path.parent / target).resolve().relative_to(ROOT).as_posix() if path.parent == ROOT \
                else os.path.normpath((path.parent.relative_to(ROOT) / target).as_posix())
            # The link must work where the page is read in the repository (GitHub, an editor), not
            # only in the built site (docs/hooks.py points links to mounted files at the site's copy).
            file = ROOT / relative
            if not file.exists():
                broken.append(f"{link}: no file {relative}")
                continue
        else:
            file = path
        if anchor and anchor not in _slugs(_text_of(file)):
            broken.append(f"{link}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, broken
    if path == README:
        assert len(links) >= 15, links          # the README links into the docs


# -- code blocks ----------------------------------------------------------------------------------


def test_every_block_is_run_or_checked() -> None:
    """Every Python block has a way to be exercised, and the tests named in ``ELSEWHERE``
    really read the blocks they are listed for."""
    kinds = {block.kind for block in BLOCKS}
    assert kinds <= {"run", "fragment", "entry", "elsewhere"}, kinds
    for (page, start), (test, needles) in ELSEWHERE.items():
        found = [b for b in BLOCKS if b.page == page and b.first_line.startswith(start)]
        assert len(found) == 1, f"{page} has {len(found)} python blocks opening with {start!r}"
        source = (ROOT / test).read_text(encoding="utf-8")
        for needle in needles:
            assert needle in source, f"{test} does not mention {needle}: does it still run {page}'s {start!r}?"
    for (page, start) in CLASSIFIED:
        assert [b for b in BLOCKS if b.page == page and b.first_line.startswith(start)], (page, start)
    assert sum(b.kind == "run" for b in BLOCKS) >= 5 and sum(b.kind == "fragment" for b in BLOCKS) >= 5


def _local_redis(code: str, redis_url: str) -> str:
    """The block as pasted, with the documented local server's address replaced by the
    test session's (``redis://127.0.0.1:6379/0`` -> ``redis://127.0.0.1:PORT/0``)."""
    server = re.match(r"redis://[^/]+", redis_url)
    assert server
    return code.replace("redis://127.0.0.1:6379", server.group(0))


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "YLOCK_URL")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "run"], ids=lambda b: b.id)
def test_runnable_blocks_run_as_pasted(block: Block, tmp_path: Path, redis_server) -> None:
    script = tmp_path / "block.py"
    script.write_text(_local_redis(block.code, redis_server.url), encoding="utf-8")
    ran = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_clean_env(), capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, f"{block.id}:\n{block.code}\n{ran.stdout[-3000:]}{ran.stderr[-3000:]}"


CELERY_RUN = """
import sys
sys.path.insert(0, ".")
import block
block.app.conf.task_always_eager = True           # the task runs here, with its lock, as a worker runs it
result = block.build_report.delay(42).get()
assert result["user"] == 42 and isinstance(result["token"], int), result
print("ran", result["token"])
"""


@pytest.mark.parametrize("page", ["README.md", "docs/celery.md"])
def test_the_celery_blocks_run_their_task(page: str, tmp_path: Path, redis_server) -> None:
    """The Celery blocks define a locked task: run it (eagerly) and get its fenced result."""
    [block] = [b for b in BLOCKS if b.page == page and "base=LockedTask" in b.code and "build_report" in b.code]
    (tmp_path / "block.py").write_text(_local_redis(block.code, redis_server.url), encoding="utf-8")
    ran = subprocess.run([sys.executable, "-c", CELERY_RUN], cwd=tmp_path, env=_clean_env(), capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0 and ran.stdout.startswith("ran "), ran.stdout[-3000:] + ran.stderr[-3000:]


def test_every_block_type_checks_strictly(tmp_path: Path) -> None:
    """``mypy --strict`` on every Python block of README.md and docs/*.md: a fragment after
    its page's prelude, any other block as pasted into a new file (or, for the settings and
    module files of a project, after the names a new project's files have): a user who pastes
    them into typed code gets no error. ylock is found as the README's development install
    (``pip install -e .``) serves it, not from a path given to mypy: no ``MYPYPATH``, and
    mypy runs outside the checkout."""
    checked = list(BLOCKS)
    files = {}
    for n, block in enumerate(checked):
        pasted = [p for (page, first), p in PASTED_AFTER.items()
                  if page == block.page and block.first_line.startswith(first)]
        prelude = PRELUDES.get(block.page, PRELUDE) if block.kind in ("fragment", "entry") else \
            (pasted or [STANDALONE])[0]
        code = block.code if block.kind != "entry" else "setting = {\n" + block.code + "}\n"
        name = f"block_{n}_{re.sub(r'[^a-z0-9]+', '_', block.page.lower())}_{block.line}.py"
        # the prelude on one line, so mypy's line numbers are the block's lines plus one
        (tmp_path / name).write_text(prelude + "# --- " + block.id + "\n" + code, encoding="utf-8")
        files[name] = (block, len(prelude.splitlines()) + 1)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG, encoding="utf-8")
    checked_run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir",
         str(tmp_path / ".mypy_cache"), "--no-error-summary", "--show-error-codes", *sorted(files)],
        cwd=tmp_path, env={k: v for k, v in _clean_env().items() if k not in ("MYPYPATH", "PYTHONPATH")},
        capture_output=True, text=True, timeout=600)
    errors = []
    for line in checked_run.stdout.splitlines():
        match = re.match(r"(block_[^:]+\.py):(\d+): (.*)", line)
        if match:
            block, offset = files[match.group(1)]
            errors.append(f"{block.page}:{block.line + int(match.group(2)) - offset}: {match.group(3)}")
        elif line.strip():
            errors.append(line)
    assert checked_run.returncode == 0 and not errors, "\n".join(errors) or checked_run.stderr[-3000:]
    assert len(files) == len(BLOCKS) >= 40


def _documented_ylock_commands() -> list[tuple[str, str, list[str]]]:
    """Every ``ylock --url ... VERB [--option ...]`` line of the shell blocks: (page, verb,
    options), the options before a ``--`` that starts the command ``ylock run`` runs."""
    found = []
    for path in PAGES:
        for match in FENCE.finditer(path.read_text(encoding="utf-8")):
            if match.group(1) not in ("sh", "bash", "console"):
                continue
            for line in match.group(2).splitlines():
                command = re.match(r'^(?:\$ )?ylock --url "\$YLOCK_URL" (\w+)(.*)$', line)
                if command:
                    rest = command.group(2).split("#", 1)[0].split(" -- ", 1)[0]
                    found.append((path.relative_to(ROOT).as_posix(), command.group(1), re.findall(r"--[a-z-]+", rest)))
    return found


def test_the_documented_command_lines_exist() -> None:
    """The shell blocks' ``ylock`` command lines name verbs and options the console script has
    (its ``--help``), so a reader pasting one gets no usage error."""
    documented = _documented_ylock_commands()
    assert {verb for _, verb, _ in documented} >= {"list", "inspect", "release", "stats", "run"}, documented
    helps: dict[str, str] = {}
    for page, verb, options in documented:
        if verb not in helps:
            shown = subprocess.run([sys.executable, "-m", "ylock.cli", verb, "--help"], env=_clean_env(),
                                   capture_output=True, text=True, timeout=60)
            assert shown.returncode == 0, f"{page}: ylock {verb}: {shown.stderr}"
            helps[verb] = shown.stdout
        for option in options:
            assert re.search(rf"{option}\b", helps[verb]), f"{page}: ylock {verb} has no {option}"
