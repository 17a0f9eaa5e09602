"""Certified decisions: gate and review decisions as signed records in the
experiments' record chains, append-only like the certified results.

PostgreSQL gets a trigger against UPDATE and DELETE, SQLite against UPDATE
(as in 0002, whose reasons hold here too). Decisions made before this
migration are certified by 0011.
"""

import django.db.models.deletion
from django.db import migrations, models

import evolution.fields

TABLE = "evolution_certifieddecision"
POSTGRES_UP = f"""
CREATE OR REPLACE FUNCTION evolution_certifieddecision_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = 'certified decisions are append-only (' || TG_OP || ' refused)';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER evolution_certifieddecision_no_update_delete
    BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION evolution_certifieddecision_append_only();
"""
POSTGRES_DOWN = f"""
DROP TRIGGER IF EXISTS evolution_certifieddecision_no_update_delete ON {TABLE};
DROP FUNCTION IF EXISTS evolution_certifieddecision_append_only();
"""
SQLITE_UP = f"""CREATE TRIGGER evolution_certifieddecision_no_update BEFORE UPDATE ON {TABLE}
       BEGIN SELECT RAISE(ABORT, 'certified decisions are append-only (UPDATE refused)'); END;"""
SQLITE_DOWN = "DROP TRIGGER IF EXISTS evolution_certifieddecision_no_update;"


def triggers_up(apps, schema_editor) -> None:
    vendor = schema_editor.connection.vendor
    if vendor in ("postgresql", "sqlite"):
        schema_editor.execute(POSTGRES_UP if vendor == "postgresql" else SQLITE_UP)


def triggers_down(apps, schema_editor) -> None:
    vendor = schema_editor.connection.vendor
    if vendor in ("postgresql", "sqlite"):
        schema_editor.execute(POSTGRES_DOWN if vendor == "postgresql" else SQLITE_DOWN)


class Migration(migrations.Migration):
    dependencies = [
        ("evolution", "0009_certified_result_canonical_payload"),
    ]

    operations = [
        migrations.CreateModel(
            name="CertifiedDecision",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("seq", models.PositiveIntegerField()),
                ("kind", models.CharField(choices=[("gate", "Gate"), ("review", "Review")], max_length=10)),
                ("payload", evolution.fields.CanonicalJSONField()),
                ("prev_digest", models.CharField(max_length=64)),
                ("record_digest", models.CharField(max_length=64, unique=True)),
                ("signature", models.CharField(max_length=64)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "candidate",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="certified_decisions",
                        to="evolution.candidate",
                    ),
                ),
                (
                    "experiment",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="certified_decisions",
                        to="evolution.experiment",
                    ),
                ),
            ],
            options={
                "ordering": ["experiment_id", "seq"],
            },
        ),
        migrations.AddField(
            model_name="gatedecision",
            name="record",
            field=models.OneToOneField(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="gate_decision",
                to="evolution.certifieddecision",
            ),
        ),
        migrations.AddField(
            model_name="reviewdecision",
            name="record",
            field=models.OneToOneField(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="review_decision",
                to="evolution.certifieddecision",
            ),
        ),
        migrations.AddConstraint(
            model_name="certifieddecision",
            constraint=models.UniqueConstraint(fields=("experiment", "seq"), name="certified_decision_unique_seq"),
        ),
        migrations.RunPython(triggers_up, triggers_down),
    ]
