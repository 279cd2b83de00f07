"""The "Locks" page of the Django admin: what every YLOCK engine holds and queues right now,
and a force-release that asks first and is written to the admin log.

The admin autodiscovers this module only where ``django.contrib.admin`` is installed; it
registers :class:`~django_ylock.models.Lock`, a model without a table (see
:mod:`django_ylock.models`), so the page has the admin's usual place, permissions and log,
while :class:`LockAdmin` replaces the changelist with a live view of the engines:

* one section per engine alias, in settings order; an engine that cannot be reached is
  shown as down (the error in the page), the others still listed;
* filters by engine, kind (lock or semaphore) and group (the group is passed to
  ``engine.describe(group)``, so the engine lists that group only);
* pages of :attr:`LockAdmin.list_per_page` locks per engine (``?p=2``: ``engine.describe(group,
  limit)`` with the limit of the pages so far, so the first page costs a hundred locks' worth
  of the engine's time whatever it holds), with how many there are in all;
* per lock: its holders with what they said they do (``ylock.context``), host, pid and
  for how long, the lease left, the fencing token, the waiters in queue order, and a
  semaphore's permits. A holder on this host whose process is gone is flagged *stale*,
  with the time its lease frees the lock;
* "Release…" (``django_ylock.release_lock``) opens a confirmation page; confirming
  (a POST, CSRF-protected like every admin view) calls ``engine.force_release()``: the
  holders find out at their next renewal (``lock.lost``, ``LockLost`` at release, a
  ``lost`` event). The release is recorded as a :class:`~django.contrib.admin.models.LogEntry`
  (a deletion of the lock, by the user) and logged by the ``django_ylock.admin`` logger.

Only the changelist and the release page are routed: there is nothing to add, change or
delete in a database.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from django_ylock import conf
from django_ylock.models import Lock
from ylock.engines.base import LOCK, SEMAPHORE, Engine, LockInfo
from ylock.errors import LockError
from ylock.names import check_group, check_name
from ylock.owner import process_gone, process_id

logger = logging.getLogger(__name__)

#: The permission that the release needs (superusers have every permission).
RELEASE_PERMISSION = "django_ylock.release_lock"
VIEW_PERMISSION = "django_ylock.view_lock"
KINDS = {LOCK: "Locks", SEMAPHORE: "Semaphores"}
#: A process that started this long after a hold was taken cannot have taken it (its pid
#: was reused). Slack for the boot time that /proc gives in whole seconds, and clock steps.


# -- holders and waiters, for people -----------------------------------------------------------------

@dataclass
class Party:
    """One holder or waiter of a lock, as the page shows it."""

    owner: str
    mode: str | None                   # a waiter's: what it waits for
    what: str | None                   # what it said it is doing (ylock.context)
    fields: list[tuple[str, Any]]      # the other things it said
    host: str | None
    pid: int | None
    since: datetime | None             # when it took the hold (or queued)
    age: str | None                    # how long ago, for people
    stale: bool = False                # its process is gone from this host


@dataclass
class Row:
    """One lock or semaphore of one engine."""

    alias: str
    info: LockInfo
    holders: list[Party]
    waiters: list[Party]
    lease: str                          # the holders' lease left, for people
    release_url: str
    stale: bool = False                 # every holder's process is gone

    @property
    def frees(self) -> str:
        """When the holders' lease frees the lock if nobody renews it, for people."""
        return "when its session expires" if self.info.ttl is None else f"in {self.info.ttl:.1f} s"

    @property
    def label(self) -> str:
        return f"{self.info.group}/{self.info.name}"

    @property
    def description(self) -> str:
        """E.g. "the write lock reports/nightly on engine default", for messages and the log."""
        held = (f"the {self.info.mode} lock" if self.info.kind == LOCK and self.info.mode
                else "the semaphore" if self.info.kind == SEMAPHORE else "the lock")
        return f"{held} {self.label} on engine {self.alias}"


@dataclass
class EngineSection:
    """What one engine holds (or why it could not say)."""

    alias: str
    url: str
    rows: list[Row] = field(default_factory=list)
    error: str | None = None           # the engine is down (or misconfigured)
    total: int = 0                     # how many the engine holds or queues for (about: see Listing.total)
    first: int = 0                     # the number of the page's first row (1-based; 0: no rows)
    previous_url: str | None = None    # the pages before and after this one, if any
    next_url: str | None = None

    def count(self, kind: str) -> int:
        return sum(1 for r in self.rows if r.info.kind == kind)

    @property
    def last(self) -> int:
        """The number of the page's last row."""
        return self.first + len(self.rows) - 1

    @property
    def locks(self) -> int:
        return self.count(LOCK)

    @property
    def semaphores(self) -> int:
        return self.count(SEMAPHORE)

    @property
    def waiting(self) -> int:
        return sum(len(r.waiters) for r in self.rows)


def age(seconds: float) -> str:
    """Return a duration for people: ``"4 s"``, ``"3 min 5 s"``, ``"2 h 4 min"``, ``"3 d 2 h"``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def lease_left(ttl: float | None) -> str:
    """Return the lease left, for people (None: the hold lives as long as its session)."""
    return "while its session lives" if ttl is None else f"{ttl:.1f} s"


def this_host() -> str:
    """Return this host's name as owner ids spell it (their first part)."""
    return process_id().split(":", 1)[0]


def party(owner: str, mode: str | None, context: Mapping[str, Any], now: float, host: str) -> Party:
    """Describe one holder or waiter from its :attr:`LockInfo.context` entry."""
    said = dict(context)
    what, their_host, pid, since = said.pop("what", None), said.pop("host", None), said.pop("pid", None), \
        said.pop("since", None)
    # The engine's own verdict (LockInfo.context's "stale") is the badge, not one more field.
    flagged = said.pop("stale", None) is True
    pid = pid if isinstance(pid, int) else None
    since = float(since) if isinstance(since, (int, float)) else None
    stale = flagged or (their_host == host and pid is not None and process_gone(pid, since))
    return Party(owner=owner, mode=mode, what=None if what is None else str(what), fields=sorted(said.items()),
                 host=None if their_host is None else str(their_host), pid=pid,
                 since=None if since is None else datetime.fromtimestamp(since, tz=timezone.utc),
                 age=None if since is None else age(now - since), stale=stale)


# -- the page -------------------------------------------------------------------------------------------

@admin.register(Lock)
class LockAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The "Locks" page: a live view of the engines instead of a changelist of rows (see
    the module docstring), and the release confirmation page."""

    change_list_template = "django_ylock/admin/locks.html"
    release_confirmation_template = "django_ylock/admin/release_confirmation.html"
    #: Locks per engine and page (``?p=N`` pages on: the Django admin's own name for both).
    list_per_page = 100

    # Nothing to add, change or delete: the rows are the engines', not the database's.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(VIEW_PERMISSION) or self.has_release_permission(request)

    def has_release_permission(self, request: HttpRequest) -> bool:
        """Return True if the user may force-release locks (``django_ylock.release_lock``)."""
        return bool(request.user.has_perm(RELEASE_PERMISSION))

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view           # staff login, CSRF protection, never cached
        return [
            path("", view(self.changelist_view), name=self._url_name("changelist")),
            path("release/", view(self.release_view), name=self._url_name("release")),
        ]

    def _url_name(self, page: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{page}"

    def _url(self, page: str) -> str:
        return reverse(f"admin:{self._url_name(page)}", current_app=self.admin_site.name)

    # -- the list -------------------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The Locks page: every engine's (or the filtered) locks, asked of the engines now."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        registry = conf.current().registry
        aliases = registry.aliases()
        problems = []
        engine_filter = request.GET.get("engine") or None
        if engine_filter is not None and engine_filter not in aliases:
            problems.append(f"There is no engine {engine_filter!r} in YLOCK['ENGINES'].")
            engine_filter = None
        kind = request.GET.get("kind") or None
        if kind is not None and kind not in KINDS:
            problems.append(f"There is no kind {kind!r}: lock or semaphore.")
            kind = None
        group = request.GET.get("group") or None
        if group is not None:
            try:
                check_group(group)
            except ValueError as exc:
                problems.append(str(exc))
                group = None
        try:
            page = max(1, int(request.GET.get("p") or 1))
        except ValueError:
            problems.append(f"There is no page {request.GET.get('p')!r}: pages are numbered from 1.")
            page = 1
        sections = [self._section(request, alias, registry.engine, group, kind, page)
                    for alias in aliases if engine_filter in (None, alias)]
        seen_groups = sorted({r.info.group for s in sections for r in s.rows} | ({group} if group else set()))
        filtered = {"engine": engine_filter, "kind": kind, "group": group}
        for section in sections:
            if section.first > self.list_per_page:
                section.previous_url = _query({**filtered, "p": str(page - 1)})
            if section.first + len(section.rows) - 1 < section.total and len(section.rows) == self.list_per_page:
                section.next_url = _query({**filtered, "p": str(page + 1)})
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Locks",
            "subtitle": None,
            "sections": sections,
            "problems": problems,
            "can_release": self.has_release_permission(request),
            "filtered": any(filtered.values()),
            "clear_filters_url": "?",
            "refresh_url": _query(filtered),
            "filters": [_choices(filtered, "engine", {a: a for a in aliases}),
                        _choices(filtered, "kind", KINDS),
                        _choices(filtered, "group", {g: g for g in seen_groups})],
            "host": this_host(),
            # the legend of the STALE badge, only where the page shows one
            "any_stale": any(p.stale for s in sections for r in s.rows for p in (*r.holders, *r.waiters)),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.change_list_template, context)

    def _section(self, request: HttpRequest, alias: str, build: Callable[[str], Engine], group: str | None,
                 kind: str | None, page: int = 1) -> EngineSection:
        """Return page ``page`` of what engine ``alias`` holds (of ``group``, of ``kind``), and
        how many there are, or why it cannot say."""
        try:
            engine = build(alias)
        except LockError as exc:
            return EngineSection(alias, "", error=_one_line(exc))
        section = EngineSection(alias, engine.url_for_display())
        per_page = self.list_per_page
        try:
            listing = engine.describe(group, page * per_page)
        except LockError as exc:
            section.error = _one_line(exc)
            return section
        found = [i for i in listing if kind in (None, i.kind)]
        # A kind filtered out of a full listing is counted out; of a page, the total is the engine's.
        section.total = len(found) if len(listing) == listing.total else listing.total
        shown = found[(page - 1) * per_page:page * per_page]
        section.first = (page - 1) * per_page + 1 if shown else 0
        filters = request.GET.urlencode()
        section.rows = [self._row(alias, info, filters) for info in shown]
        return section

    def _row(self, alias: str, info: LockInfo, filters: str = "") -> Row:
        now, host = time.time(), this_host()
        holders = [party(o, info.mode, info.context.get(o, {}), now, host) for o in info.owners]
        waiters = []
        for w in info.waiters:
            mode, _, owner = w.partition(":")
            waiters.append(party(owner, mode, info.context.get(owner, {}), now, host))
        target = {"engine": alias, "kind": info.kind, "group": info.group, "name": info.name}
        if filters:
            target["_changelist_filters"] = filters
        return Row(alias, info, holders, waiters, lease_left(info.ttl), f"{self._url('release')}?{urlencode(target)}",
                   stale=bool(holders) and all(h.stale for h in holders))

    # -- the release ----------------------------------------------------------------------------------

    def release_view(self, request: HttpRequest) -> HttpResponse:
        """GET: ask whether to force-release the lock named in the query string; POST (the
        confirmation): release it, write the admin log, go back to the list."""
        if not self.has_release_permission(request):
            raise PermissionDenied
        alias, kind, group, name = self._target(request)
        filters = request.GET.get("_changelist_filters", "")
        back = self._url("changelist") + (f"?{filters}" if filters else "")
        label = f"{kind} {group}/{name} on engine {alias}"
        try:
            engine = conf.current().registry.engine(alias)
            info = engine.describe_lock(group, name, kind)
        except LockError as exc:
            self.message_user(request, f"Engine {alias} is down: {_one_line(exc)}", messages.ERROR)
            return HttpResponseRedirect(back)
        if info is None or not (info.owners or info.waiters):
            self.message_user(request, f"Nothing to release: the {label} is free.", messages.WARNING)
            return HttpResponseRedirect(back)
        row = self._row(alias, info)
        changed = None
        if request.method == "POST" and request.POST.get("post") == "yes":
            seen = request.POST.get("token", "")
            if seen != ("" if info.token is None else str(info.token)):
                changed = seen          # someone else holds it now: show them, and ask again
            else:
                return self._release(request, engine, row, back)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Are you sure?",
            "subtitle": None,
            "row": row,
            "changed": changed,
            "back": back,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.release_confirmation_template, context)

    def _target(self, request: HttpRequest) -> tuple[str, str, str, str]:
        alias, kind = request.GET.get("engine", ""), request.GET.get("kind", LOCK)
        group, name = request.GET.get("group", ""), request.GET.get("name", "")
        if alias not in conf.current().registry.aliases():
            raise BadRequest(f"no engine {alias!r} in YLOCK['ENGINES']")
        if kind not in KINDS:
            raise BadRequest(f"kind must be lock or semaphore, not {kind!r}")
        try:
            check_group(group)
            check_name(name)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        return alias, kind, group, name

    def _release(self, request: HttpRequest, engine: Engine, row: Row, back: str) -> HttpResponse:
        info = row.info
        try:
            had = engine.force_release(info.group, info.name, info.kind)
        except LockError as exc:
            self.message_user(request, f"Engine {row.alias} is down: {_one_line(exc)}", messages.ERROR)
            return HttpResponseRedirect(back)
        user = request.user.get_username()
        logger.warning("ylock: %s force-released %s (%s)", user, row.description,
                       "it was held" if had else "nobody held it")
        # LogEntry.objects.create, not log_action(s): the one call that Django 4.2 to 6.x all have.
        LogEntry.objects.create(
            user_id=request.user.pk,
            content_type_id=ContentType.objects.get_for_model(Lock).pk,
            object_id=f"{row.alias}/{info.kind}/{info.group}/{info.name}",
            object_repr=f"{info.kind} {row.label} on {row.alias}"[:200],
            action_flag=DELETION,
            change_message=_log_message(user, row, had),
        )
        if had:
            self.message_user(request, f"Released {row.description}: its holders are told they lost it.",
                              messages.SUCCESS)
        else:
            self.message_user(request, f"Nobody held {row.description} any more; its waiters were dropped.",
                              messages.WARNING)
        return HttpResponseRedirect(back)


def _log_message(user: str, row: Row, had: bool) -> str:
    """The admin log's account of a force-release: who, and whom it took the lock from."""
    def who(p: Party) -> str:
        where = f"{p.host}:{p.pid}" if p.host else p.owner
        return f"{p.what} ({where})" if p.what else where
    info = row.info
    holders = ", ".join(who(h) for h in row.holders) if had else ""
    text = (f"Force-released by {user}: {info.mode} by {holders}, token {info.token}" if holders
            else f"Force-released by {user}: nobody held it")
    if row.waiters:
        text += f"; {len(row.waiters)} waiter{'s' if len(row.waiters) > 1 else ''} dropped"
    return text + "."


def _choices(filtered: Mapping[str, str | None], key: str,
             values: Mapping[str, str]) -> tuple[str, list[tuple[str, bool, str]]]:
    """One filter of the sidebar: its title and its (label, selected, query string) choices."""
    return key, [("All", filtered[key] is None, _query({**filtered, key: None}))] + \
        [(label, filtered[key] == value, _query({**filtered, key: value})) for value, label in values.items()]


def _query(params: Mapping[str, str | None]) -> str:
    """Return the query string of the list page with these filters (None: not filtered)."""
    kept = {k: v for k, v in params.items() if v is not None}
    return "?" + urlencode(kept) if kept else "?"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__

