from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list = []
    operations = [
        migrations.CreateModel(
            name="Account",
            fields=[("id", models.AutoField(primary_key=True, serialize=False)),
                    ("balance", models.IntegerField(default=0))],
        ),
        migrations.CreateModel(
            name="Entry",
            fields=[("id", models.AutoField(primary_key=True, serialize=False)),
                    ("amount", models.IntegerField()),
                    ("token", models.BigIntegerField(help_text="fencing token of the source account's lock")),
                    ("source", models.ForeignKey(on_delete=models.deletion.CASCADE, related_name="+",
                                                 to="bank.account")),
                    ("target", models.ForeignKey(on_delete=models.deletion.CASCADE, related_name="+",
                                                 to="bank.account"))],
        ),
    ]
