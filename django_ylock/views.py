"""The Prometheus endpoint: ``path("metrics", django_ylock.views.metrics)`` in your urls.

It serves the exposition of the exporter that ``YLOCK["METRICS"]["PROMETHEUS"]`` started
(its own registry by default, or ``prometheus_client.REGISTRY`` with ``"REGISTRY":
"default"``), or with ``$PROMETHEUS_MULTIPROC_DIR`` set every worker's values (a
``MultiProcessCollector``: see docs/metrics.md); 404 when Prometheus metrics are not
configured. Protect it as you would any internal endpoint (a URL only your scraper
reaches, or a decorator of your own).
"""
from __future__ import annotations

from django.apps import apps
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Return the Prometheus text exposition of the lock metrics."""
    exporter = getattr(apps.get_app_config("django_ylock").metrics, "prometheus", None)
    if exporter is None:
        raise Http404("YLOCK['METRICS'] has no PROMETHEUS exporter")
    body, content_type = exporter.expose()
    return HttpResponse(body, content_type=content_type)
