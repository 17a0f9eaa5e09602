"""A ledger row says whether its candidate was admissible, apart from whether it was accepted.

"Accepted" means adopted as the next harness; a candidate that passed every rule but lost to a sibling with a
higher S is admissible, not refuted (docs/concepts.md, rule B). Rows written before this read the gate decision
of their candidate: accepted rows are admissible, and so is a row whose candidate's gate decision in that run gave
an admissible rule.
"""

from django.db import migrations, models

ADMISSIBLE_RULES = (
    "admissible_above_noise",
    "inside_noise_gain",
    "passes_floor",
    "unfiltered",
    "unregularized_beats_best",
)


def forward(apps, schema_editor):
    LedgerEntry = apps.get_model("evolution", "LedgerEntry")
    GateDecision = apps.get_model("evolution", "GateDecision")
    LedgerEntry.objects.filter(accepted=True).update(admissible=True)
    for run_id, candidate_id in GateDecision.objects.filter(rule__in=ADMISSIBLE_RULES).values_list(
        "run_id", "candidate_id"
    ):
        LedgerEntry.objects.filter(run_id=run_id, candidate_id=candidate_id).update(admissible=True)


class Migration(migrations.Migration):
    dependencies = [("evolution", "0012_ledger_delta_cost_null")]

    operations = [
        migrations.AddField(model_name="ledgerentry", name="admissible", field=models.BooleanField(default=False)),
        migrations.RunPython(forward, migrations.RunPython.noop),
    ]
