"""The default failure taxonomy (docs/concepts.md, section 7) as shared annotation labels.

Shared labels have ``experiment = NULL``; teams add their own per experiment.
Forward is idempotent (update_or_create by slug). Reverse removes the
default labels; it fails (ProtectedError) while annotations still use them,
which is what we want: reversing must not silently drop people's work.
"""

from django.db import migrations

DEFAULT_LABELS = [
    (
        "judgment-error",
        "Judgment error (right data, wrong rule)",
        "The agent had the information it needed but applied the wrong rule, policy or reasoning step to it.",
    ),
    (
        "data-processing-error",
        "Data-processing error",
        "The agent read or transformed data incorrectly: parsing, arithmetic, filtering, sorting or formatting.",
    ),
    (
        "information-forgotten",
        "Collected information forgotten",
        "The agent found the relevant information earlier in the trajectory but did not use it in the answer.",
    ),
    (
        "sources-combined-wrongly",
        "Sources combined wrongly",
        "Each source was read correctly, but the agent merged, joined or reconciled them incorrectly.",
    ),
    (
        "tool-misuse",
        "Tool misuse",
        "Wrong tool, wrong arguments, ignored tool errors, or a tool result misread.",
    ),
    (
        "environment-or-timeout",
        "Environment or timeout",
        "The failure came from the environment, not the harness: timeout, crash, sandbox or infrastructure error.",
    ),
    (
        "other",
        "Other",
        "None of the above; say what happened in the note.",
    ),
]


def create_default_labels(apps, schema_editor):
    AnnotationLabel = apps.get_model("evolution", "AnnotationLabel")
    for slug, name, description in DEFAULT_LABELS:
        AnnotationLabel.objects.update_or_create(
            experiment=None, slug=slug, defaults={"name": name, "description": description}
        )


def delete_default_labels(apps, schema_editor):
    AnnotationLabel = apps.get_model("evolution", "AnnotationLabel")
    for label in AnnotationLabel.objects.filter(experiment__isnull=True, slug__in=[s for s, _n, _d in DEFAULT_LABELS]):
        label.delete()


class Migration(migrations.Migration):
    dependencies = [
        ("evolution", "0003_review_permissions"),
    ]

    operations = [
        migrations.RunPython(create_default_labels, delete_default_labels),
    ]
