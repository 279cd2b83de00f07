"""OpenTelemetry traces of lock waits and holds (the ``otel`` extra: ``opentelemetry-api``).

    import ylock.tracing
    ylock.tracing.enable()          # once, where OpenTelemetry is configured

From then on every first acquisition of a lock or a semaphore makes a span for the wait
("ylock wait <group>") and one for the hold ("ylock hold <group>", from the first
acquisition to the final release, so re-entries do not cut it), with the group, name,
mode, engine, token and outcome as attributes. A span's name is a group, never a lock
name: span names become metric dimensions (the OpenTelemetry Collector's spanmetrics
connector, Tempo's and Jaeger's span metrics key by them), and lock names of per-user
or keyed locks are unbounded (see ylock.metrics.tags); the name is the ``ylock.name``
attribute, which those make a dimension only when told to; a timeout, an unreachable engine or
a lost lease is the span's status or an event. The hold span is a child of the span
current where the lock was taken, or the root of a trace of its own when there is none
(a script, a Celery worker or a command without tracing of their own).

Who blocked whom: the hold span's own ``traceparent`` (W3C) is stored with the hold, in
the holder note every engine keeps (what ``describe()`` shows as the holder's context,
see :func:`ylock.context`), and a waiter's wait span *links* to the hold spans of the
holders it waited for, in any process, with each holder's context as the link's
attributes (``ylock.holder`` = its owner id, ``ylock.holder.<key>`` = what it said it was
doing, its host, pid and since when it holds). The note has to go out with the
acquisition request, before the hold span can exist: so the hold span's ids are drawn
before the request and its span is started with them at the grant. OpenTelemetry's API
has no way to name a span's ids, the SDK's tracer has one (its ``id_generator``): ylock's
own tracer gets an id generator that hands a hold span the ids drawn for it and passes
everything else to the provider's. With a tracer that is not the SDK's (no
``id_generator``), holds are traced but store no ``traceparent``, so waits link to nothing.

How the links are found: with tracing on, the engine tells when an acquisition starts to
wait, and the Redis engine sends the holders' notes with it (the try that queued asked for
them: no request of its own); the other engines' waits read the lock's holders then (one
request). Without tracing enabled none of this runs: the lock path checks one empty tuple.
Tracing is a watcher of the lock path (:class:`ylock.events.Watcher`): the facade never
imports this module, and this module uses public names only. Enabled while OpenTelemetry
has no tracer provider configured (the API alone, or the SDK not set up yet), an
acquisition checks that once and goes the untraced way; a provider set later is picked
up by the next acquisition. See ``bench/`` for the measured cost.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ylock import events
from ylock.engines.base import LOCK, SEMAPHORE
from ylock.version import __version__

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ylock.holds import Hold

#: The active tracing (None: off), watching the lock path (:func:`ylock.events.watch`).
ACTIVE: Tracing | None = None

#: The (trace id, span id) drawn for the hold span being started (None: draw as usual).
_drawn: ContextVar[tuple[int, int] | None] = ContextVar("ylock_hold_span_ids", default=None)


class HoldIds:
    """The id generator of ylock's tracer (the SDK's ``IdGenerator`` protocol): the ids drawn
    for a hold span before its acquisition request (:data:`_drawn`, set while that span is
    started), else those of the generator it wraps, the tracer provider's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def generate_span_id(self) -> int:
        """Return the drawn span id while a hold span starts, else a new one."""
        drawn = _drawn.get()
        return self.inner.generate_span_id() if drawn is None else drawn[1]

    def generate_trace_id(self) -> int:
        """Return the drawn trace id while a hold span starts (as a root), else a new one."""
        drawn = _drawn.get()
        return self.inner.generate_trace_id() if drawn is None else drawn[0]

    def is_trace_id_random(self) -> bool:
        """Answer as the wrapped generator does (the drawn ids are its own)."""
        return bool(getattr(self.inner, "is_trace_id_random", lambda: False)())


class Tracing:
    """Spans for one tracer (see the module docstring)."""

    def __init__(self, tracer: Any, provider: Any = None) -> None:
        """``provider``: the tracer provider given to :func:`enable`; None: the global one,
        looked up on each acquisition (it may be set after ``enable()``)."""
        from opentelemetry import trace
        from opentelemetry.propagators.textmap import DefaultGetter
        from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        self._trace = trace
        self._ids_of: Any = None       # the tracer whose id generator self._ids is
        self._ids: HoldIds | None = None
        self._status, self._code = Status, StatusCode
        self._no_provider = (NoOpTracerProvider, ProxyTracerProvider)
        self._fixed = None if provider is None else not isinstance(provider, self._no_provider)
        # Where no provider is named by the environment, OpenTelemetry's global provider is
        # unset exactly while its module global is None: one attribute read instead of
        # get_tracer_provider()'s os.environ lookup (about 1 µs) on every acquisition. If a
        # later OpenTelemetry renames that global, the getattr default takes the full path.
        self._unset_global = None if "OTEL_PYTHON_TRACER_PROVIDER" in os.environ else "_TRACER_PROVIDER"
        self._propagator = TraceContextTextMapPropagator()
        self._getter: Any = DefaultGetter()

    def on(self) -> bool:
        """Whether spans would go anywhere: a tracer provider is configured (the global one
        is a proxy that does nothing until the application sets one)."""
        if self._fixed is not None:
            return self._fixed
        if self._unset_global is not None and getattr(self._trace, self._unset_global, self) is None:
            return False
        return not isinstance(self._trace.get_tracer_provider(), self._no_provider)

    # -- the trace context stored with a hold ------------------------------------------------

    def _hold_ids(self) -> HoldIds | None:
        """Return the id generator of the tracer that starts hold spans, made a
        :class:`HoldIds` on first use (None: not the SDK's tracer, whose ids cannot be chosen)."""
        tracer = self.tracer
        if isinstance(tracer, self._trace.ProxyTracer):
            # enable() before the application set its provider: the proxy's tracer is the
            # one the provider hands out for ylock (the SDK keeps one per name and version),
            # and a global provider is set once, so it is kept from now on.

            tracer = self.tracer = self._trace.get_tracer_provider().get_tracer("ylock", __version__)
        if tracer is self._ids_of:
            return self._ids
        ids = getattr(tracer, "id_generator", None)
        if ids is not None and not isinstance(ids, HoldIds):
            ids = tracer.id_generator = HoldIds(ids)
        self._ids_of, self._ids = tracer, ids
        return ids

    def _link(self, owner: str, said: Mapping[str, Any]) -> Any:
        """Return a link to the hold span named by a holder's ``traceparent``, with what the
        holder said about itself as attributes (None: no ``traceparent``, or not a valid one)."""
        parent = said.get("traceparent")
        if not isinstance(parent, str):
            return None
        span_context = self._trace.get_current_span(
            self._propagator.extract({"traceparent": parent}, getter=self._getter)).get_span_context()
        if not span_context.is_valid:
            return None
        attributes: dict[str, Any] = {"ylock.holder": owner}
        for key, value in said.items():
            if key != "traceparent" and isinstance(value, (str, bool, int, float)):
                attributes[f"ylock.holder.{key}"] = value
        return self._trace.Link(span_context, attributes)

    # -- waits (see ylock.events.Watcher) ------------------------------------------------------

    def _attributes(self, target: Any, mode: str) -> dict[str, Any]:
        return {"ylock.group": target.group, "ylock.name": target.name, "ylock.mode": mode,
                "ylock.kind": target.kind, "ylock.engine": target.engine.scheme}

    def _holders(self, target: Any, told: Mapping[str, Mapping[str, Any]] | None) -> list[Any]:
        """Links to the hold spans of the holders waited for: those the engine told of when
        the acquisition queued (Redis: in the reply of the try that queued it), else read here
        (one request to the engine)."""
        if told is not None:
            links = [self._link(owner, said) for owner, said in told.items()]
            return [link for link in links if link is not None]
        try:
            info = target.engine.describe_lock(target.group, target.name, SEMAPHORE if target.kind == SEMAPHORE
                                               else LOCK)
        except Exception:  # noqa: BLE001 - the links are a nicety; the wait goes on without them
            logger.debug("the holders of %s/%s were not read; the wait span links to none", target.group,
                         target.name, exc_info=True)
            return []
        if info is None:
            return []
        links = [self._link(owner, info.context.get(owner, {})) for owner in info.owners]
        return [link for link in links if link is not None]

    def _wait_span(self, target: Any, mode: str, links: list[Any], started_ns: int) -> Any:
        return self.tracer.start_span(f"ylock wait {target.group}", links=links,
                                      attributes=self._attributes(target, mode), start_time=started_ns)

    def start(self, acquisition: events.Acquisition) -> None:
        """Draw the hold span's ids and store its ``traceparent`` with the hold (waiters link
        to it): the trace of the span current here (the hold span's parent at the grant), or
        a new one."""
        ids = self._hold_ids()
        if ids is None:
            return
        parent = self._trace.get_current_span().get_span_context()
        if parent.is_valid:
            trace_id, flags = parent.trace_id, int(parent.trace_flags)
        else:
            # The sampler has not decided yet (it does at the grant): the flags say sampled,
            # as most roots are; a waiter's link uses the ids only.
            trace_id, flags = ids.inner.generate_trace_id(), 0x03 if ids.is_trace_id_random() else 0x01
        span_id = ids.inner.generate_span_id()
        acquisition.notes[(self, "hold")] = (trace_id, span_id)
        acquisition.context = {**(acquisition.context or {}),
                               "traceparent": f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"}

    def waiting(self, acquisition: events.Acquisition) -> None:
        """Start the wait span, linked to the hold spans of the holders waited for (the
        ``traceparent`` in their holder notes): as the engine told when the acquisition
        queued, or read once now."""
        target = acquisition.target
        acquisition.notes[self] = self._wait_span(target, acquisition.mode,
                                                  self._holders(target, acquisition.holders),
                                                  acquisition.started_ns)

    def waited(self, acquisition: events.Acquisition, token: int | None, error: BaseException | None) -> None:
        """End the wait span (one without links if the first try settled it)."""
        span = acquisition.notes.pop(self, None)
        if span is None:
            span = self._wait_span(acquisition.target, acquisition.mode, [], acquisition.started_ns)
        Status, StatusCode = self._status, self._code   # noqa: N806 - OpenTelemetry's names
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)))
            span.set_attribute("ylock.outcome", "error")
        elif token is None:
            span.set_attribute("ylock.outcome", "timed_out")
            span.set_status(Status(StatusCode.ERROR, "timed out"))
        else:
            span.set_attribute("ylock.outcome", "acquired")
            span.set_attribute("ylock.token", token)
        span.end()

    # -- holds ---------------------------------------------------------------------------------

    def held(self, acquisition: events.Acquisition, hold: Hold) -> None:
        """Start the hold span of a first acquisition, kept on the hold (``hold.span``)."""
        target = acquisition.target
        drawn = _drawn.set(acquisition.notes.pop((self, "hold"), None))
        try:
            hold.span = self.tracer.start_span(f"ylock hold {target.group}",
                                               attributes={**self._attributes(target, acquisition.mode),
                                                           "ylock.token": hold.token})
        finally:
            _drawn.reset(drawn)

    def released(self, hold: Hold) -> None:
        """End a hold's span at its final release (an error status if the hold was lost)."""
        released(hold)


def released(hold: Hold) -> None:
    """End a hold's span at its final release (an error status if the hold was lost)."""
    span, hold.span = hold.span, None
    if span is not None:
        from opentelemetry.trace import Status, StatusCode

        if hold.lost:
            span.set_status(Status(StatusCode.ERROR, f"lost: {hold.lost_reason}"))
        span.end()


def enable(tracer_provider: Any = None) -> Tracing:
    """Trace every lock wait and hold from now on (with ``tracer_provider``, else the global
    one of OpenTelemetry); return the :class:`Tracing`."""
    global ACTIVE
    from opentelemetry import trace


    provider = tracer_provider or trace.get_tracer_provider()
    disable()
    ACTIVE = Tracing(provider.get_tracer("ylock", __version__), tracer_provider)
    events.watch(ACTIVE)
    return ACTIVE


def disable() -> None:
    """Stop tracing lock waits and holds."""
    global ACTIVE
    if ACTIVE is not None:
        events.unwatch(ACTIVE)
    ACTIVE = None


__all__ = ["enable", "disable", "released", "Tracing", "HoldIds", "ACTIVE"]
