from django.db import models

import django_ylock


class Account(models.Model):
    balance = models.IntegerField(default=0)
    fence = django_ylock.FenceField()

    class Meta:
        app_label = "fencing_bank"
