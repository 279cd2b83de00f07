"""OpenTelemetry traces of lock waits and holds (the ``otel`` extra: ``opentelemetry-api``).

    import ylock.tracing
    ylock.tracing.enable()          # once, where OpenTelemetry is configured

From then on every first acquisition of a lock or a semaphore makes a span for the wait
("ylock wait <group>/<name>") and one for the hold ("ylock hold <group>/<name>", from the
first acquisition to the final release, so re-entries do not cut it), with the group,
name, mode, engine, token and outcome as attributes; a timeout, an unreachable engine or
a lost lease is the span's status or an event. The trace context of the code that took a
hold is stored with the hold (its ``traceparent``, in the hold's context, see
:func:`ylock.context`), and a waiter's wait span *links* to the spans of the holders it
waited for, so a trace viewer shows who blocked whom, across processes.

How the links are found: with tracing on, an acquisition first tries once without
waiting; only if that fails does it read the lock's holders (one request) before it
waits. Without tracing enabled none of this runs: the lock path checks one empty tuple.
Tracing is a watcher of the lock path (:class:`ylock.events.Watcher`): the facade never
imports this module, and this module uses public names only. Enabled while OpenTelemetry
has no tracer provider configured (the API alone, or the SDK not set up yet), an
acquisition checks that once and goes the untraced way; a provider set later is picked
up by the next acquisition. See ``bench/`` for the measured cost.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ylock import events
from ylock.engines.base import LOCK, SEMAPHORE

if TYPE_CHECKING:
    from ylock.holds import Hold

#: The active tracing (None: off), watching the lock path (:func:`ylock.events.watch`).
ACTIVE: Tracing | None = None


class Tracing:
    """Spans for one tracer (see the module docstring)."""

    def __init__(self, tracer: Any, provider: Any = None) -> None:
        """``provider``: the tracer provider given to :func:`enable`; None: the global one,
        looked up on each acquisition (it may be set after ``enable()``)."""
        from opentelemetry import trace
        from opentelemetry.propagators.textmap import DefaultGetter, DefaultSetter
        from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        self._trace = trace
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
        self._setter: Any = DefaultSetter()

    def on(self) -> bool:
        """Whether spans would go anywhere: a tracer provider is configured (the global one
        is a proxy that does nothing until the application sets one)."""
        if self._fixed is not None:
            return self._fixed
        if self._unset_global is not None and getattr(self._trace, self._unset_global, self) is None:
            return False
        return not isinstance(self._trace.get_tracer_provider(), self._no_provider)

    # -- the trace context stored with a hold ------------------------------------------------

    def context(self, context: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """``context`` plus the caller's ``traceparent`` (when a span is current)."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, setter=self._setter)
        if "traceparent" not in carrier:
            return context
        return {**(context or {}), "traceparent": carrier["traceparent"]}

    def _link(self, said: Mapping[str, Any]) -> Any:
        parent = said.get("traceparent")
        if not isinstance(parent, str):
            return None
        span_context = self._trace.get_current_span(
            self._propagator.extract({"traceparent": parent}, getter=self._getter)).get_span_context()
        return self._trace.Link(span_context) if span_context.is_valid else None

    # -- waits (see ylock.events.Watcher) ------------------------------------------------------

    def _attributes(self, target: Any, mode: str) -> dict[str, Any]:
        return {"ylock.group": target.group, "ylock.name": target.name, "ylock.mode": mode,
                "ylock.kind": target.kind, "ylock.engine": target.engine.scheme}

    def _holders(self, target: Any) -> list[Any]:
        try:
            info = target.engine.describe_lock(target.group, target.name, SEMAPHORE if target.kind == SEMAPHORE
                                               else LOCK)
        except Exception:  # noqa: BLE001 - the links are a nicety; the wait goes on without them
            return []
        if info is None:
            return []
        links = [self._link(info.context.get(owner, {})) for owner in info.owners]
        return [link for link in links if link is not None]

    def _wait_span(self, target: Any, mode: str, links: list[Any], started_ns: int) -> Any:
        return self.tracer.start_span(f"ylock wait {target.group}/{target.name}", links=links,
                                      attributes=self._attributes(target, mode), start_time=started_ns)

    def start(self, acquisition: events.Acquisition) -> None:
        """Store the caller's ``traceparent`` with the hold (waiters link to it)."""
        acquisition.context = self.context(acquisition.context)

    def waiting(self, acquisition: events.Acquisition) -> None:
        """Start the wait span, linked to the spans of the holders waited for (their hold
        context's ``traceparent``): read once, after the first try failed."""
        target = acquisition.target
        acquisition.notes[self] = self._wait_span(target, acquisition.mode, self._holders(target),
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
        hold.span = self.tracer.start_span(f"ylock hold {target.group}/{target.name}",
                                           attributes={**self._attributes(target, acquisition.mode),
                                                       "ylock.token": hold.token})

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

    from ylock import __version__

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


__all__ = ["enable", "disable", "released", "Tracing", "ACTIVE"]
