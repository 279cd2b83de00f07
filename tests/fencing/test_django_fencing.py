"""``django_ylock.fenced_update``, ``fenced_save`` and ``FenceField`` in one process, on the
test database (SQLite) and real Redis locks: what is written, what is refused, what is
rejected as bad input, inside and outside ``transaction.atomic()``, with the request's lock
in a ``@locked`` view and a Celery ``LockedTask``'s hold. (The paused-holder scenario with
real processes and PostgreSQL is test_paused_holder.py.)"""
from __future__ import annotations

import io
import uuid

import pytest
from django.core.management import call_command
from django.db import DatabaseError, models, transaction
from django.db.models import F
from django.test import Client

import django_ylock
import ylock
from tests.fencing.bankapp.models import Account

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def account() -> Account:
    return Account.objects.create(balance=0)


def rows(pk: int) -> models.QuerySet[Account]:
    return Account.objects.filter(pk=pk)


def test_a_newer_token_writes_the_same_token_writes_again_an_older_one_is_fenced_out(account):
    assert django_ylock.fenced_update(rows(account.pk), 7, balance=F("balance") + 10) == 1
    assert django_ylock.fenced_update(rows(account.pk), 7, balance=F("balance") + 10) == 1   # same holder again
    with pytest.raises(ylock.FencedOut) as caught:
        django_ylock.fenced_update(rows(account.pk), 6, balance=0)
    assert isinstance(caught.value, ylock.LockLost) and caught.value.token == 6
    assert "newer than 6" in str(caught.value)
    account.refresh_from_db()
    assert (account.balance, account.fence) == (20, 7)
    assert django_ylock.fenced_update(rows(account.pk), 9, balance=1) == 1
    account.refresh_from_db()
    assert (account.balance, account.fence) == (1, 9)


def test_rows_that_do_not_exist_change_nothing_and_are_not_fenced_out(account):
    assert django_ylock.fenced_update(rows(account.pk + 1000), 1, balance=5) == 0
    assert django_ylock.fenced_update(Account.objects.none(), 1, balance=5) == 0


def test_a_held_lock_gives_its_token_and_one_not_held_is_refused(ylock_django, account):
    lock = django_ylock.locks("accounts")[str(account.pk)]
    with pytest.raises(ValueError, match="token_or_lock: .* is not held"):
        django_ylock.fenced_update(rows(account.pk), lock, balance=1)
    with lock.write(timeout=5):
        assert django_ylock.fenced_update(rows(account.pk), lock, balance=3) == 1
        token = lock.token
    account.refresh_from_db()
    assert (account.balance, account.fence) == (3, token)
    with lock.write(timeout=5):                   # the next acquisition has a newer token
        assert lock.token > token
        django_ylock.fenced_save(account, lock)
    with pytest.raises(ylock.FencedOut) as caught:
        django_ylock.fenced_update(rows(account.pk), token, balance=99)
    assert caught.value.token == token


@pytest.mark.parametrize("bad, error", [(True, TypeError), ("7", TypeError), (1.5, TypeError), (-1, ValueError),
                                        (2**63, ValueError), (object(), TypeError)])
def test_bad_tokens_are_rejected_naming_the_argument(account, bad, error):
    with pytest.raises(error, match="token_or_lock"):
        django_ylock.fenced_update(rows(account.pk), bad, balance=1)
    account.refresh_from_db()
    assert account.fence == 0


def test_bad_querysets_and_values_are_rejected(account):
    with pytest.raises(TypeError, match="queryset must be a QuerySet"):
        django_ylock.fenced_update(Account, 1, balance=1)
    with pytest.raises(TypeError, match="sets fence itself"):
        django_ylock.fenced_update(rows(account.pk), 1, fence=5)
    from django.contrib.contenttypes.models import ContentType
    with pytest.raises(TypeError, match="exactly one django_ylock.FenceField on contenttypes.ContentType"):
        django_ylock.fenced_update(ContentType.objects.all(), 1, model="x")


def test_inside_atomic_a_fenced_out_write_rolls_back_with_the_transaction(account):
    django_ylock.fenced_update(rows(account.pk), 5, balance=50)
    other = Account.objects.create(balance=0)
    with pytest.raises(ylock.FencedOut), transaction.atomic():
        assert django_ylock.fenced_update(rows(other.pk), 4, balance=40) == 1      # another row: fine
        django_ylock.fenced_update(rows(account.pk), 4, balance=40)                # stale: refused
    other.refresh_from_db()
    account.refresh_from_db()
    assert (other.balance, other.fence) == (0, 0) and (account.balance, account.fence) == (50, 5)
    with transaction.atomic():
        assert django_ylock.fenced_update(rows(account.pk), 6, balance=60) == 1
    account.refresh_from_db()
    assert (account.balance, account.fence) == (60, 6)


def test_fenced_save_inserts_updates_refuses_and_reports_a_missing_row():
    new = Account(balance=5)
    django_ylock.fenced_save(new, 3)
    assert new.pk is not None and Account.objects.get(pk=new.pk).fence == 3
    new.balance = 8
    django_ylock.fenced_save(new, 4, update_fields=["balance"])
    assert (Account.objects.get(pk=new.pk).balance, new.fence) == (8, 4)
    new.balance = 1000
    with pytest.raises(ylock.FencedOut):
        django_ylock.fenced_save(new, 3)
    assert Account.objects.get(pk=new.pk).balance == 8
    with pytest.raises(ValueError, match="update_fields: \\['nope'\\]"):
        django_ylock.fenced_save(new, 5, update_fields=["nope"])
    Account.objects.filter(pk=new.pk).delete()
    with pytest.raises(DatabaseError, match="not in the database"):
        django_ylock.fenced_save(new, 5)


def test_fence_field_defaults_to_zero_and_makemigrations_writes_it_plainly():
    field = Account._meta.get_field("fence")
    assert isinstance(field, models.BigIntegerField) and field.default == 0 and not field.editable
    assert field.deconstruct()[1:] == ("django_ylock.fencing.FenceField", [], {})
    assert Account.objects.create().fence == 0
    # The app's migrations (0001: the table without a fence; 0002: AddField, as makemigrations
    # wrote it) match the model: nothing more to migrate, and no question to answer.
    out = io.StringIO()
    call_command("makemigrations", "fencing_bank", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_a_locked_view_writes_with_the_requests_token(ylock_django, settings, account):
    settings.ROOT_URLCONF = "tests.fencing.views"
    client = Client()
    first = client.post(f"/deposit/{account.pk}/").json()
    second = client.post(f"/deposit/{account.pk}/").json()
    assert first["changed"] == second["changed"] == 1 and second["token"] > first["token"]
    account.refresh_from_db()
    assert (account.balance, account.fence) == (2, second["token"])


@pytest.mark.parametrize("view", ["current", "acurrent"])
def test_a_locked_view_writes_with_current_lock(ylock_django, settings, account, view):
    settings.ROOT_URLCONF = "tests.fencing.views"
    client = Client()
    first = client.post(f"/{view}/{account.pk}/").json()
    second = client.post(f"/{view}/{account.pk}/").json()
    assert first["changed"] == second["changed"] == 1 and second["token"] > first["token"] > 0
    account.refresh_from_db()
    assert (account.balance, account.fence) == (2, second["token"])


def test_a_locked_view_with_current_lock_is_fenced_out_by_a_newer_token(ylock_django, settings, account):
    # A newer holder already wrote (a token beyond any the engine has given: as if this
    # request's hold had been lost and retaken meanwhile): the view's write is refused.
    settings.ROOT_URLCONF = "tests.fencing.views"
    django_ylock.fenced_update(rows(account.pk), 2**62, balance=5)
    response = Client().post(f"/stale/{account.pk}/")
    assert response.status_code == 409 and "accounts" in response.json()["fenced_out"]
    account.refresh_from_db()
    assert (account.balance, account.fence) == (5, 2**62)


def test_a_celery_locked_task_writes_with_its_token(ylock_django, account):
    from celery import Celery

    from celery_ylock import LockedTask

    app = Celery(f"fencing{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.ylock_url = ylock_django
    tokens = []

    @app.task(base=LockedTask, bind=True, shared=False, lock={"name": "accounts", "key": "{account_id}"})
    def deposit(self, account_id):
        tokens.append(self.request.ylock.token)
        return django_ylock.fenced_update(rows(account_id), self.request.ylock, balance=F("balance") + 5)

    assert deposit(account.pk) == 1
    account.refresh_from_db()
    assert (account.balance, account.fence) == (5, tokens[0]) and tokens[0] > 0
