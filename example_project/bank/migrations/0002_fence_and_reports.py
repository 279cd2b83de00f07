# As `makemigrations` writes it: the fence is added to the existing accounts table with its
# default (0) for every existing row, no question asked; plus the report's computations.
from django.db import migrations, models

import django_ylock.fencing


class Migration(migrations.Migration):
    dependencies = [("bank", "0001_initial")]
    operations = [
        migrations.AddField(model_name="account", name="fence", field=django_ylock.fencing.FenceField()),
        migrations.CreateModel(
            name="ReportRun",
            fields=[("id", models.AutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                    ("total", models.IntegerField()),
                    ("computed_at", models.DateTimeField(auto_now_add=True))],
        ),
    ]
