# The table as it was before fencing: no fence column (0002 adds it, as makemigrations writes it).
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        migrations.CreateModel(
            name="Account",
            fields=[("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                               verbose_name="ID")),
                    ("balance", models.IntegerField(default=0))],
        ),
    ]
