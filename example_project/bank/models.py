from django.db import models

import django_ylock


class Account(models.Model):
    balance = models.IntegerField(default=0)
    # The fencing token of the last fenced write (django_ylock.fenced_save / fenced_update):
    # a holder paused past its lease cannot overwrite a newer holder's balance. Added to the
    # existing table by a plain makemigrations (0002): existing rows get 0.
    fence = django_ylock.FenceField()


class Entry(models.Model):
    """The ledger: one row per transfer, written under the transfer's locks."""

    source = models.ForeignKey(Account, related_name="+", on_delete=models.CASCADE)
    target = models.ForeignKey(Account, related_name="+", on_delete=models.CASCADE)
    amount = models.IntegerField()
    token = models.BigIntegerField(help_text="fencing token of the source account's lock")


class ReportRun(models.Model):
    """One computation of the bank report (the cached report of ``/report``): the demo counts
    them to show that a burst of requests on a cold cache computes it once."""

    total = models.IntegerField()
    computed_at = models.DateTimeField(auto_now_add=True)
