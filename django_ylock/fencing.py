"""Fenced writes in the Django ORM: the storage refuses a stale lock holder.

    class Account(models.Model):
        balance = models.IntegerField()
        fence = django_ylock.FenceField()

    with django_ylock.locks("accounts")[str(pk)].write(timeout=5) as lock:
        django_ylock.fenced_update(Account.objects.filter(pk=pk), lock, balance=F("balance") + 10)

:func:`fenced_update` is one conditional UPDATE (``SET fence = token, ... WHERE <the
queryset> AND fence <= token``), so it needs no transaction and works inside one; a holder
paused past its lease whose rows a newer holder has written gets :class:`ylock.FencedOut`
and writes nothing. :func:`fenced_save` does the same for a model instance. The rules
(why ``<=``, what a token guarantees per engine) are in :mod:`ylock.fencing` and
docs/fencing.md.

**Existing tables.** Add ``fence = django_ylock.FenceField()`` to the model and run
``makemigrations``: the field has a default (0), so Django asks nothing and the migration
fills the column with 0 for every existing row; any token is >= 0, so the first fenced
write of each row is accepted.
"""
from __future__ import annotations

from typing import Any

from django.db import DatabaseError, models

from ylock.fencing import fenced_out, token_of


class FenceField(models.BigIntegerField):  # type: ignore[misc]  # (Django ships no type stubs here)
    """The fencing token of the last fenced write of a row: a ``BIGINT NOT NULL DEFAULT 0``
    that :func:`fenced_update` and :func:`fenced_save` set and check. Not editable (forms
    and the admin leave it alone): only fenced writes change it."""

    description = "Fencing token of the last fenced write"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 0)
        kwargs.setdefault("editable", False)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        # Migrations written by makemigrations then say FenceField() and keep working if
        # the defaults change (they are the field's, not the migration's).
        if kwargs.get("default") == 0:
            del kwargs["default"]
        if kwargs.get("editable") is False:
            del kwargs["editable"]
        return name, path, args, kwargs


def fence_field(model: type[models.Model]) -> FenceField:
    """Return the one :class:`FenceField` of ``model``; raise TypeError if it has none or several."""
    fields = [f for f in model._meta.concrete_fields if isinstance(f, FenceField)]
    if len(fields) != 1:
        found = ", ".join(f.name for f in fields) or "none"
        raise TypeError(f"a fenced write needs exactly one django_ylock.FenceField on {model._meta.label} "
                        f"(found: {found}); add `fence = django_ylock.FenceField()` and run makemigrations")
    return fields[0]


def fenced_update(queryset: models.QuerySet[Any], token_or_lock: Any, **values: Any) -> int:
    """Update the rows of ``queryset`` with ``values`` (as ``queryset.update(**values)``) in
    one conditional UPDATE that also sets their fence to the token and skips rows fenced by
    a newer token; return the rows changed.

    ``token_or_lock``: a fencing token, or a lock held by this thread (``lock.token``; a
    Celery task's ``self.request.ylock``). A lock not held is refused (ValueError).
    Raise :class:`ylock.FencedOut` (nothing was written) when no row changed because rows of
    the queryset carry a newer token; rows that do not exist return 0, as ``update()`` does.
    """
    if not isinstance(queryset, models.QuerySet):
        raise TypeError(f"queryset must be a QuerySet (Model.objects.filter(...)), got {queryset!r}")
    token = token_of(token_or_lock, "token_or_lock")
    field = fence_field(queryset.model)
    if field.name in values or field.attname in values:
        raise TypeError(f"fenced_update sets {field.name} itself (to the token); do not pass it in values")
    changed: int = queryset.filter(**{f"{field.name}__lte": token}).update(**{field.name: token}, **values)
    # Asked after the UPDATE: a newer holder that wrote in between is seen here (its write is
    # what refused ours), and rows that never existed are not mistaken for a newer holder's.
    if changed == 0 and queryset.filter(**{f"{field.name}__gt": token}).exists():
        raise fenced_out(token, f"rows of {queryset.model._meta.label}", token_or_lock)
    return changed


def fenced_save(instance: models.Model, token_or_lock: Any, update_fields: Any = None,
                using: str | None = None) -> None:
    """Save ``instance`` fenced: an instance not yet in the database is inserted with the
    token as its fence (``save()``); an existing one is written with :func:`fenced_update`
    (its concrete fields, or only ``update_fields``), and its fence set to the token.

    Raise :class:`ylock.FencedOut` (nothing was written) when a newer holder has written the
    row, and ``DatabaseError`` when the row is gone (as ``save(update_fields=...)`` does)."""
    if not isinstance(instance, models.Model):
        raise TypeError(f"instance must be a model instance, got {instance!r}")
    token = token_of(token_or_lock, "token_or_lock")
    model = type(instance)
    field = fence_field(model)
    using = using or instance._state.db or "default"
    if instance._state.adding or instance.pk is None:
        setattr(instance, field.attname, token)
        instance.save(using=using, update_fields=update_fields)
        return
    meta = instance._meta
    if update_fields is None:
        fields = [f for f in meta.concrete_fields if not f.primary_key and f is not field]
    else:
        names = set(update_fields)
        fields = [f for f in meta.concrete_fields if (f.name in names or f.attname in names) and f is not field]
        unknown = names - {f.name for f in fields} - {f.attname for f in fields} - {field.name, field.attname}
        if unknown:
            raise ValueError(f"update_fields: {sorted(unknown)} are not concrete fields of {meta.label}")
    values = {f.attname: f.pre_save(instance, False) for f in fields}
    rows = model._base_manager.using(using).filter(pk=instance.pk)
    if not fenced_update(rows, token_or_lock, **values):
        raise DatabaseError(f"fenced_save: {meta.label} pk={instance.pk!r} is not in the database")
    setattr(instance, field.attname, token)
