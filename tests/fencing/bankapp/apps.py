from django.apps import AppConfig


class BankAppConfig(AppConfig):
    name = "tests.fencing.bankapp"
    label = "fencing_bank"
    default_auto_field = "django.db.models.BigAutoField"
