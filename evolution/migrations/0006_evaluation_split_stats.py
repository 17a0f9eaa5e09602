"""Per-split trial totals of certified evaluations, stored at certification
so screens do not scan every trial; filled here for the evaluations already
certified."""

from __future__ import annotations

from typing import Any

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Count, Q, Sum


def backfill(apps: Any, schema_editor: Any) -> None:
    Evaluation = apps.get_model("evolution", "Evaluation")
    Trial = apps.get_model("evolution", "Trial")
    Stats = apps.get_model("evolution", "EvaluationSplitStats")
    certified = Evaluation.objects.filter(state="certified").values("pk")
    rows = (
        Trial.objects.filter(evaluation__in=certified)
        .values("evaluation_id", "candidate_id", "split")
        .annotate(
            n=Count("pk"),
            passed=Count("pk", filter=Q(outcome="pass")),
            errors=Count("pk", filter=Q(outcome="error")),
            score_sum=Sum("score", filter=~Q(outcome="error"), default=0.0),
            tokens_sum=Sum("tokens", default=0),
            tokens_count=Count("tokens"),
        )
        .order_by()
    )
    Stats.objects.bulk_create(
        (
            Stats(
                evaluation_id=row["evaluation_id"],
                candidate_id=row["candidate_id"],
                split=row["split"],
                trials=row["n"],
                passed=row["passed"],
                errors=row["errors"],
                score_sum=row["score_sum"] or 0.0,
                tokens_sum=row["tokens_sum"] or 0,
                tokens_count=row["tokens_count"],
            )
            for row in rows.iterator()
        ),
        batch_size=2000,
        ignore_conflicts=True,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("evolution", "0005_evaluation_external"),
    ]

    operations = [
        migrations.CreateModel(
            name="EvaluationSplitStats",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "split",
                    models.CharField(
                        choices=[
                            ("train", "Train"),
                            ("gate", "Gate"),
                            ("sealed", "Sealed"),
                            ("heldout", "Heldout"),
                        ],
                        max_length=10,
                    ),
                ),
                ("trials", models.PositiveIntegerField()),
                ("passed", models.PositiveIntegerField()),
                ("errors", models.PositiveIntegerField()),
                ("score_sum", models.FloatField()),
                ("tokens_sum", models.PositiveBigIntegerField()),
                ("tokens_count", models.PositiveIntegerField()),
                (
                    "candidate",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="evolution.candidate"
                    ),
                ),
                (
                    "evaluation",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="split_stats",
                        to="evolution.evaluation",
                    ),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("evaluation", "split"), name="split_stats_unique")],
            },
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
