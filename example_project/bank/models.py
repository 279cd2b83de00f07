from django.db import models


class Account(models.Model):
    balance = models.IntegerField(default=0)


class Entry(models.Model):
    """The ledger: one row per transfer, written under the transfer's locks."""

    source = models.ForeignKey(Account, related_name="+", on_delete=models.CASCADE)
    target = models.ForeignKey(Account, related_name="+", on_delete=models.CASCADE)
    amount = models.IntegerField()
    token = models.BigIntegerField(help_text="fencing token of the source account's lock")
