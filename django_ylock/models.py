"""The admin's "Locks" page: a model without a table.

Locks live on the engines' servers, not in the database, so :class:`Lock` has no table
(``managed = False``) and never queries one. It exists only to give the page what the
admin hangs on models: a place in the admin index, a content type for the admin log
(:class:`~django.contrib.admin.models.LogEntry`), and its permissions:

``django_ylock.view_lock``
    see the page (what every engine holds and queues right now);
``django_ylock.release_lock``
    force-release a lock or semaphore from it (implies seeing it). Superusers have both.

:mod:`django_ylock.admin` registers it (only where ``django.contrib.admin`` is installed:
the admin autodiscovers that module).
"""
from __future__ import annotations

from django.db import models


class NoRows(models.Manager["Lock"]):
    """Return no rows without asking the database: there is no table. (``manage.py dumpdata``
    reads every model through its managers; an unmanaged model without a table would stop it
    with "no such table", as it does for other apps that use this pattern.)"""

    def get_queryset(self) -> models.QuerySet[Lock]:
        return super().get_queryset().none()


class Lock(models.Model):
    """A lock or semaphore held or waited for on one of the YLOCK engines (no table: the
    admin page asks the engines; see the module docstring)."""

    objects = NoRows()

    class Meta:
        managed = False
        base_manager_name = "objects"
        default_permissions = ("view",)
        permissions = [("release_lock", "Can force-release a lock or semaphore")]
        verbose_name = "lock"
        verbose_name_plural = "locks"

    def __str__(self) -> str:
        return "lock"
