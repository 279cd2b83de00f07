"""The admin's "Locks" page in a real browser (Debian's chromium, headless, driven by
Selenium through /usr/bin/chromedriver) against pytest-django's live server and the
session's redis-server: locks held by other processes, the release through its
confirmation page, the permission, an engine that is down, the admin log.

The project's test settings have no admin; :func:`admin_site` installs it for these tests
(apps, templates, middleware, URLs, its table), and gives the live server, which was
started with the project's middleware, a handler built with the admin's.

``YLOCK_ADMIN_SCREENSHOT=docs/admin.png python -m pytest tests/dj/test_admin.py`` also
writes the README's screenshot there.
"""
from __future__ import annotations

import contextlib
import io
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection
from django.test import Client
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

import ylock
from ylock.owner import process_id

HOLDER = Path(__file__).with_name("admin_holder.py")
CHROMIUM = os.environ.get("YLOCK_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("YLOCK_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
PASSWORD = "not-a-secret-7"
ROOT = Path(__file__).resolve().parents[2]


# -- the browser -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """Headless chromium that downloads nothing: the driver's path is given, so Selenium
    Manager never runs, and chromium's own background traffic is off."""
    for binary in (CHROMIUM, CHROMEDRIVER):
        assert os.access(binary, os.X_OK), f"{binary} is missing: apt-get install chromium chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,900",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def wait_for(condition: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> object:
    """Return the first truthy ``condition()``, polling until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def rows(browser: webdriver.Chrome) -> dict[str, WebElement]:
    """The Locks page's rows, by ``kind group/name``."""
    return {f"{r.get_attribute('data-kind')} {r.get_attribute('data-group')}/{r.get_attribute('data-name')}": r
            for r in browser.find_elements(By.CSS_SELECTOR, "tr.ylock-row")}


def log_in(browser: webdriver.Chrome, live_server: object, username: str) -> None:
    browser.get(f"{live_server}/admin/login/")
    browser.delete_all_cookies()
    browser.get(f"{live_server}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys(username)
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: browser.find_elements(By.ID, "user-tools"), what="the admin index after logging in")


@pytest.fixture
def group() -> str:
    """A lock group no other test uses (a readable one: it is in the screenshot)."""
    return f"reports-{uuid.uuid4().hex[:6]}"


# -- the admin, installed for these tests ------------------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def admin_site(settings: object, transactional_db: None, live_server: object, redis_server: object) -> Iterator[object]:
    """The admin on the live server; YLOCK with the session's redis-server (``default``,
    the key prefix that tests/dj/conftest.py checks for leftovers) and an engine nobody
    listens for (``offline``)."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.handlers.wsgi import WSGIHandler

    apps = ["django.contrib.admin", "django.contrib.messages", "django.contrib.staticfiles"]
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, *(a for a in apps if a not in settings.INSTALLED_APPS)]
    middleware = ["django.middleware.csrf.CsrfViewMiddleware", "django.contrib.messages.middleware.MessageMiddleware"]
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, *(m for m in middleware if m not in settings.MIDDLEWARE)]
    settings.TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
                           "OPTIONS": {"context_processors": ["django.template.context_processors.request",
                                                             "django.contrib.auth.context_processors.auth",
                                                             "django.contrib.messages.context_processors.messages"]}}]
    settings.ROOT_URLCONF = "tests.dj.admin_urls"
    settings.STATIC_URL = "/static/"
    settings.YLOCK = {"ENGINES": {
        "default": {"URL": redis_server.url, "OPTIONS": {"prefix": "dj"}},          # type: ignore[attr-defined]
        "offline": {"URL": f"redis://127.0.0.1:{_closed_port()}/0"},
    }}
    if "django_admin_log" not in connection.introspection.table_names():
        call_command("migrate", "admin", verbosity=0)
    httpd = live_server.thread.httpd                                                 # type: ignore[attr-defined]
    started_with = httpd.get_app()
    httpd.set_app(StaticFilesHandler(WSGIHandler()))      # WSGIHandler loads MIDDLEWARE once, when built
    yield live_server
    httpd.set_app(started_with)
    from django.contrib.admin.models import LogEntry

    LogEntry.objects.all().delete()     # before the users go: the table outlives these settings


@pytest.fixture
def make_user(django_user_model: type) -> Callable[..., object]:
    def make(username: str, *codenames: str) -> object:
        user = django_user_model.objects.create_user(username, password=PASSWORD, is_staff=True)
        user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_ylock",
                                                            codename__in=codenames))
        return user
    return make


@pytest.fixture
def engine(redis_server: object) -> Iterator[ylock.Engine]:
    engine = ylock.engine_from_url(redis_server.url + "?prefix=dj")                  # type: ignore[attr-defined]
    yield engine
    engine.close()


# -- other processes ----------------------------------------------------------------------------------

class Holder:
    """A tests/dj/admin_holder.py process, and what it printed."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HOLDER), *args], cwd=ROOT, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def expect(self, prefix: str, timeout: float = 15.0) -> str:
        """Return the next line printed (it must start with ``prefix``)."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"holder {self.proc.args[3:]} printed nothing in {timeout} s "
                                 f"(exit code {self.proc.poll()})") from None
        assert line.startswith(prefix), line
        return line

    def finish(self, timeout: float = 15.0) -> int:
        """Close its standard input (it releases what it holds) and return its exit code."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.wait(timeout)


@pytest.fixture
def holders(engine: ylock.Engine, group: str, redis_server: object) -> Iterator[Callable[..., Holder]]:
    """Start holder processes on the ``default`` engine in this test's group; at the end,
    stop them and drop what a crashed one left (conftest.py checks that nothing is held)."""
    started: list[Holder] = []

    def start(*args: str) -> Holder:
        holder = Holder(redis_server.url + "?prefix=dj", group, *args)               # type: ignore[attr-defined]
        started.append(holder)
        return holder
    yield start
    for holder in started:
        try:
            holder.finish()
        except subprocess.TimeoutExpired:
            holder.proc.kill()
            holder.proc.wait()
    for info in engine.describe(group):
        engine.force_release(info.group, info.name, info.kind)


# -- the tests ----------------------------------------------------------------------------------------------

def test_release_a_lock_that_another_process_holds(admin_site: object, browser: webdriver.Chrome,
                                                   holders: Callable[..., Holder], engine: ylock.Engine,
                                                   group: str, make_user: Callable[..., object],
                                                   tmp_path: Path) -> None:
    from django.contrib.admin.models import DELETION, LogEntry

    releaser = make_user("ops", "release_lock")
    exporter = holders("hold", "nightly-export")
    token = exporter.expect("held ").split()[1]
    crashed = holders("crash", "cache-warmup")
    crashed.expect("held ")
    assert crashed.proc.wait(10) < 0                   # killed: its lock stays until its lease runs out
    holders("scene").expect("ready")
    wait_for(lambda: (i := engine.describe_lock(group, "invoices")) and i.waiters, what="the queued writer")

    log_in(browser, admin_site, "ops")
    browser.find_element(By.LINK_TEXT, "Locks").click()
    browser.find_element(By.LINK_TEXT, group).click()          # the filter: this test's group only
    assert browser.find_element(By.CSS_SELECTOR, "details[data-filter-title=group] li.selected a").text == group

    found = rows(browser)
    assert set(found) == {f"lock {group}/nightly-export", f"lock {group}/cache-warmup", f"lock {group}/invoices",
                          f"semaphore {group}/thumbnails"}
    export = found[f"lock {group}/nightly-export"]
    holder_text = export.find_element(By.CSS_SELECTOR, ".ylock-holders").text
    assert "nightly export" in holder_text and "job=export-42" in holder_text
    assert f"{process_id().split(':')[0]} pid {exporter.pid}" in holder_text and "held for" in holder_text
    assert export.find_element(By.CSS_SELECTOR, ".ylock-token").text == token
    assert export.find_element(By.CSS_SELECTOR, ".ylock-mode").text == "write"
    assert export.find_element(By.CSS_SELECTOR, ".ylock-lease").text.endswith(" s")
    assert not export.find_elements(By.CSS_SELECTOR, ".ylock-stale")
    stale = found[f"lock {group}/cache-warmup"].find_element(By.CSS_SELECTOR, ".ylock-stale-note").text
    assert f"process {crashed.pid} is gone from this host" in stale and "its lease frees it in" in stale
    # the STALE badge says it once: the engine's "stale" flag is not shown again as a field
    stale_holder = found[f"lock {group}/cache-warmup"].find_element(By.CSS_SELECTOR, ".ylock-holders").text
    assert "stale=" not in stale_holder and "stale=True" not in browser.page_source, stale_holder
    assert browser.find_element(By.CSS_SELECTOR, ".ylock-stale-legend").is_displayed()   # a stale row: its legend
    assert len(token) >= 16                                     # Redis tokens: what must fit on one line
    assert_one_line(browser, export.find_element(By.CSS_SELECTOR, ".ylock-token"))
    sem = found[f"semaphore {group}/thumbnails"]
    assert sem.find_element(By.CSS_SELECTOR, ".ylock-permits").text == "2 of 3 permits taken"
    assert sem.find_element(By.CSS_SELECTOR, ".ylock-holders").text.count("resize images") == 2
    waiters = found[f"lock {group}/invoices"].find_element(By.CSS_SELECTOR, ".ylock-waiters").text
    assert "write" in waiters and "close the books" in waiters and "waiting for" in waiters
    down = browser.find_element(By.CSS_SELECTOR, "section[data-engine=offline] .ylock-down").text
    assert down.startswith("Engine offline is down:")
    screenshot(browser, tmp_path)

    export.find_element(By.CSS_SELECTOR, "a.ylock-release").click()
    page(browser, "#content-main .ylock-confirm-release")      # the confirmation page has loaded
    assert browser.find_element(By.TAG_NAME, "h1").text == "Are you sure?"
    confirm = browser.find_element(By.ID, "content-main").text
    assert f"the write lock {group}/nightly-export on engine default" in confirm
    assert "nightly export" in confirm and token in confirm
    browser.find_element(By.CSS_SELECTOR, "input.ylock-confirm-release").click()

    message = page(browser, ".messagelist .success").text       # the list again, once it has loaded
    assert message == f"Released the write lock {group}/nightly-export on engine default: " \
                      "its holders are told they lost it."
    assert f"lock {group}/nightly-export" not in rows(browser)
    assert f"lock {group}/invoices" in rows(browser)              # the filter was kept
    assert exporter.proc.wait(10) == 3 and exporter.expect("lost")
    assert engine.describe_lock(group, "nightly-export") is None

    entry = LogEntry.objects.get()
    assert (entry.user, entry.action_flag) == (releaser, DELETION)
    assert entry.object_repr == f"lock {group}/nightly-export on default"
    assert entry.change_message.startswith("Force-released by ops: write by nightly export (")
    assert entry.change_message.endswith(f", token {token}.")
    browser.get(f"{admin_site}/admin/")
    assert entry.object_repr in browser.find_element(By.ID, "recent-actions-module").text


def assert_one_line(browser: webdriver.Chrome, cell: WebElement) -> None:
    """``cell``'s text is on one line and shown whole (not wrapped, not cut by an ellipsis)."""
    tops, cut = browser.execute_script(
        "const r = document.createRange(); r.selectNodeContents(arguments[0]);"
        "return [new Set([...r.getClientRects()].map(x => Math.round(x.top))).size,"
        "        arguments[0].scrollWidth > arguments[0].clientWidth];", cell)
    assert tops == 1, f"{cell.text!r} is wrapped over {tops} lines"
    assert not cut, f"{cell.text!r} is cut off"


def page(browser: webdriver.Chrome, selector: str, timeout: float = 10.0) -> WebElement:
    """The element ``selector`` once the page that a click navigated to shows it (a form's
    submit returns before the next page has loaded)."""
    return WebDriverWait(browser, timeout).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, selector)))


def screenshot(browser: webdriver.Chrome, tmp_path: Path) -> None:
    """Save the page, whole, as a PNG; copy it to $YLOCK_ADMIN_SCREENSHOT if set (the README's)."""
    if browser.find_elements(By.CSS_SELECTOR, "#nav-sidebar[aria-expanded=true]"):
        browser.find_element(By.ID, "toggle-nav-sidebar").click()       # room for the table
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 1440, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    bottom = browser.execute_script("return document.getElementById('content').getBoundingClientRect().bottom")
    height = min(max(int(bottom) + 40, 480), 1600)
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 1440, "height": height, "deviceScaleFactor": 1, "mobile": False})
    path = tmp_path / "admin.png"
    try:
        assert browser.save_screenshot(str(path))
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and 10_000 < len(data) < 1_000_000
    if os.environ.get("YLOCK_ADMIN_SCREENSHOT"):
        shutil.copyfile(path, os.environ["YLOCK_ADMIN_SCREENSHOT"])


def test_release_needs_the_permission(admin_site: object, browser: webdriver.Chrome, engine: ylock.Engine,
                                      group: str, make_user: Callable[..., object]) -> None:
    viewer = make_user("viewer", "view_lock")
    releaser = make_user("releaser", "release_lock")
    nobody = make_user("nobody")
    lock = ylock.Lock(engine, group, "orders")
    release = f"/admin/django_ylock/lock/release/?engine=default&kind=lock&group={group}&name=orders"
    with ylock.context("checkout"), lock.write(timeout=5):
        log_in(browser, admin_site, "viewer")
        browser.get(f"{admin_site}/admin/django_ylock/lock/?group={group}")
        row = rows(browser)[f"lock {group}/orders"]
        assert "checkout" in row.text
        assert not browser.find_elements(By.CSS_SELECTOR, "a.ylock-release")
        # nothing stale on the page: no STALE badge, and no legend explaining one
        assert not browser.find_elements(By.CSS_SELECTOR, ".ylock-stale, .ylock-stale-legend")
        assert "stale" not in browser.find_element(By.ID, "content-main").text.lower()
        browser.get(f"{admin_site}{release}")
        assert "403" in browser.title or "Forbidden" in browser.page_source

        client = Client(enforce_csrf_checks=True)      # the permission is not enough without the form's token
        client.force_login(releaser)
        assert client.post(release, {"post": "yes", "token": str(lock.token)}).status_code == 403
        client = Client()                    # no CSRF checks: a 403 here is the permission's
        client.force_login(viewer)
        assert client.post(release, {"post": "yes", "token": str(lock.token)}).status_code == 403
        client.force_login(nobody)
        assert client.get("/admin/django_ylock/lock/").status_code == 403
        client.force_login(releaser)         # a confirmation for another hold than this one asks again
        answer = client.post(release, {"post": "yes", "token": "1"})
        assert answer.status_code == 200 and b"changed hands since you looked" in answer.content
        assert engine.describe_lock(group, "orders").owners == (ylock.current_owner(),)
        assert not lock.lost
    from django.contrib.admin.models import LogEntry

    assert not LogEntry.objects.exists()


def test_release_buttons_fit_a_1400_px_window(admin_site: object, browser: webdriver.Chrome, engine: ylock.Engine,
                                              group: str, make_user: Callable[..., object], tmp_path: Path) -> None:
    """Long contexts, fields, owners and names wrap: every Release button is on screen, with
    the navigation sidebar open, and the page never scrolls sideways (issue #28)."""
    make_user("wide", "release_lock")
    long_what = ("recompute the quarterly revenue report for every tenant in the eu-west region " * 3)[:200]
    unbroken = "POST /api/v2/tenants/" + "a1b2c3d4" * 20 + "/reports/rebuild"       # 197 characters, no spaces
    doing = [(f"quarterly-revenue-{'x' * 40}", long_what.strip(), {"job": "j" * 80}),
             ("rebuild", unbroken, {"tenant": "t" * 120, "request": "r" * 60}),
             ("export", "nightly export", {}),
             ("cleanup", "c" * 200, {"batch": 42})]
    with contextlib.ExitStack() as held:
        for name, what, fields in doing:
            with ylock.context(what, **fields):     # each hold says its own (ylock keeps at most 200 characters)
                held.enter_context(ylock.Lock(engine, group, name).write(timeout=5))
        log_in(browser, admin_site, "wide")
        browser.set_window_size(1400, 900)
        try:
            browser.get(f"{admin_site}/admin/django_ylock/lock/?group={group}")
            if browser.find_elements(By.CSS_SELECTOR, "#nav-sidebar[aria-expanded=false]"):
                browser.find_element(By.ID, "toggle-nav-sidebar").click()       # the harder case: open
            assert browser.find_elements(By.CSS_SELECTOR, "#nav-sidebar[aria-expanded=true]")
            assert len(rows(browser)) == len(doing)
            inner = browser.execute_script("return window.innerWidth")
            assert 1300 <= inner <= 1400, inner
            buttons = browser.find_elements(By.CSS_SELECTOR, "a.ylock-release")
            assert len(buttons) == len(doing)
            for button in buttons:
                rect = browser.execute_script("return arguments[0].getBoundingClientRect().toJSON()", button)
                assert 0 <= rect["left"] and rect["right"] <= inner, (button.get_attribute("href"), rect, inner)
            wide = browser.execute_script("return document.documentElement.scrollWidth")
            assert wide <= inner, f"the page scrolls sideways: {wide} px wide in a {inner} px window"
            scrolled = browser.execute_script(
                "return [...document.querySelectorAll('.ylock-engine .results')]"
                ".filter(e => e.scrollWidth > e.clientWidth).length")
            assert scrolled == 0, "a table scrolls sideways"
            tokens = browser.find_elements(By.CSS_SELECTOR, "td.ylock-token")
            assert len(tokens) == len(doing) and all(len(t.text) >= 16 for t in tokens), [t.text for t in tokens]
            for cell in tokens:                                 # a token is read whole: never wrapped
                assert_one_line(browser, cell)
            for what in (long_what.strip(), unbroken):        # the whole text is there, if wrapped
                assert browser.find_elements(By.CSS_SELECTOR, f'.ylock-what[title="{what}"]'), what
            browser.save_screenshot(str(tmp_path / "admin-1400.png"))
            if os.environ.get("YLOCK_ADMIN_WIDE_SCREENSHOT"):
                shutil.copyfile(tmp_path / "admin-1400.png", os.environ["YLOCK_ADMIN_WIDE_SCREENSHOT"])
        finally:
            browser.set_window_size(1280, 900)


@pytest.mark.django_db
def test_the_model_has_no_table_and_dumpdata_still_works() -> None:
    out = io.StringIO()
    call_command("dumpdata", "django_ylock", stdout=out)
    assert out.getvalue().strip() == "[]"
    assert Permission.objects.filter(content_type__app_label="django_ylock").count() == 2


def test_a_holder_is_stale_when_its_pid_is_gone_or_reused(settings: object) -> None:
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "django.contrib.admin", "django.contrib.messages"]
    from django_ylock.admin import process_gone

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        assert not process_gone(child.pid, since=time.time())
        assert process_gone(child.pid, since=time.time() - 3600) == sys.platform.startswith("linux")   # reused
        assert not process_gone(os.getpid(), since=time.time() - 3600) and not process_gone(0)
    finally:
        child.kill()
        child.wait()
    assert process_gone(child.pid, since=time.time())


def test_the_locks_page_pages_what_an_engine_holds_and_says_how_many(admin_site: object, engine: ylock.Engine,
                                                                      group: str, django_user_model: type) -> None:
    """A hundred locks per page, the first of an engine's listing (``describe(group, limit)``),
    the total beside them, and links to the pages before and after (issue 41)."""
    user = django_user_model.objects.create_superuser("pager", password=PASSWORD)  # type: ignore[attr-defined]
    locks = ylock.Locks(engine, group)
    names = [f"n{i:03d}" for i in range(130)]
    for name in names:
        locks.lock(name)
    try:
        client = Client()
        client.force_login(user)
        first = client.get(f"/admin/django_ylock/lock/?engine=default&group={group}").content.decode()
        assert first.count('class="ylock-row') == 100
        assert "130 held or waited for" in first and "1&ndash;100 of 130" in first
        assert 'class="ylock-next"' in first and 'class="ylock-previous"' not in first
        assert 'data-name="n000"' in first and 'data-name="n100"' not in first     # the first hundred, in order
        second = client.get(f"/admin/django_ylock/lock/?engine=default&group={group}&p=2").content.decode()
        assert second.count('class="ylock-row') == 30 and "101&ndash;130 of 130" in second
        assert 'data-name="n129"' in second and 'data-name="n099"' not in second
        assert 'class="ylock-previous"' in second and 'class="ylock-next"' not in second
        assert "There is no page" in client.get("/admin/django_ylock/lock/?p=x").content.decode()
    finally:
        for name in names:
            locks.unlock(name)
