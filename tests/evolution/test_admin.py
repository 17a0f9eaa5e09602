"""Every model is in the admin; protected data is read-only there."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from evolution import records
from evolution.models import CertifiedResult
from tests.factories import evaluate_seed_inline, make_tiny_experiment

pytestmark = pytest.mark.django_db


def test_every_evolution_model_is_registered() -> None:
    missing = [m.__name__ for m in apps.get_app_config("evolution").get_models() if not admin.site.is_registered(m)]
    assert missing == []


def test_every_admin_list_page_renders_for_a_superuser(admin_client: Client) -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    evaluate_seed_inline(experiment, splits=("train",))
    for model in apps.get_app_config("evolution").get_models():
        url = reverse(f"admin:evolution_{model._meta.model_name}_changelist")
        response = admin_client.get(url)
        assert response.status_code == 200, url


def test_certified_results_cannot_be_changed_or_deleted_in_the_admin(admin_client: Client) -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    evaluate_seed_inline(experiment, splits=("train",))
    record = CertifiedResult.objects.get(experiment=experiment)
    shown = admin_client.get(reverse("admin:evolution_certifiedresult_change", args=[record.pk]))
    # The payload as it is stored and hashed: canonical JSON, not a Python repr.
    assert escape(records.canonical_payload(record.payload).decode()) in shown.content.decode()
    change = admin_client.post(
        reverse("admin:evolution_certifiedresult_change", args=[record.pk]), {"signature": "forged"}
    )
    delete = admin_client.post(reverse("admin:evolution_certifiedresult_delete", args=[record.pk]), {"post": "yes"})
    assert change.status_code == 403
    assert delete.status_code == 403
    assert CertifiedResult.objects.get(pk=record.pk).signature == record.signature
