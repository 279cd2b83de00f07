"""A service class with injected locks: the transfer takes both accounts' write locks,
always in id order, so two opposite transfers cannot deadlock."""
from __future__ import annotations

from contextlib import ExitStack

from django.db import transaction

from bank.models import Account, Entry
from django_ylock import InjectLock, InjectLocks


class InsufficientFunds(Exception):
    pass


class Bank:
    accounts = InjectLocks("accounts")     # one lock per account (resolved lazily)
    ledger = InjectLock("ledger")          # one global lock, read-shared by reports

    def transfer(self, source: int, target: int, amount: int) -> Entry:
        with ExitStack() as stack:
            for account_id in sorted({source, target}):
                stack.enter_context(self.accounts.write(str(account_id)))
            with self.ledger.read():                                   # audits take it for writing
                token = self.accounts.token(str(source))
                with transaction.atomic():
                    src = Account.objects.get(pk=source)
                    dst = Account.objects.get(pk=target)
                    if src.balance < amount:
                        raise InsufficientFunds(f"account {source} has {src.balance}, needs {amount}")
                    src.balance -= amount
                    dst.balance += amount
                    src.save()
                    dst.save()
                    return Entry.objects.create(source=src, target=dst, amount=amount, token=token or 0)

    def audit(self) -> int:
        """Return the sum of all balances, with no transfer half done."""
        with self.ledger.write(timeout=10):
            return sum(Account.objects.values_list("balance", flat=True))
