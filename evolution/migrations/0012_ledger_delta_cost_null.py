"""dC of a ledger row is null when the harness it was compared with reported no cost.

Before, the loop wrote 1e9 for that case (and the dashboard read anything above 1e8 as "no earlier cost"); those
rows become null, which is what they meant.
"""

from django.db import migrations, models

NO_COST_BEFORE = 1e8  # what the dashboard read as "no earlier cost"


def forward(apps, schema_editor):
    LedgerEntry = apps.get_model("evolution", "LedgerEntry")
    LedgerEntry.objects.filter(delta_cost__gte=NO_COST_BEFORE).update(delta_cost=None)


def backward(apps, schema_editor):
    LedgerEntry = apps.get_model("evolution", "LedgerEntry")
    LedgerEntry.objects.filter(delta_cost__isnull=True).update(delta_cost=1e9)


class Migration(migrations.Migration):
    dependencies = [("evolution", "0011_certify_existing_decisions")]

    operations = [
        migrations.AlterField(model_name="ledgerentry", name="delta_cost", field=models.FloatField(blank=True, null=True)),
        migrations.RunPython(forward, backward),
    ]
