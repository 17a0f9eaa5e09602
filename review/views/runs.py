"""Run control: the start form (a preset, or an earlier run's recipe, with overrides), pause, resume and cancel.

Runs change state only through ``evolution.loop.lifecycle``; every refusal is a message and changes nothing.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from evolution import access, operators
from evolution.loop import lifecycle
from evolution.models import Experiment, Run
from evolution.recipes import PRESET_NAMES
from review import hidden

# action -> (what it did, why it may be refused)
RUN_ACTIONS = {
    "pause": ("paused", "only a running run can be paused"),
    "resume": ("resumed", "only a paused run can be resumed"),
    "cancel": ("cancelled", "it has already ended"),
}


# --- Run start form ------------------------------------------------------------------


class RunStartForm(forms.Form):
    recipe = forms.ChoiceField(label="recipe")
    rounds = forms.IntegerField(required=False, min_value=1, max_value=500, label="rounds")
    k = forms.IntegerField(required=False, min_value=1, max_value=32, label="k (trials per task)")
    candidates = forms.IntegerField(required=False, min_value=1, max_value=64, label="candidates per round")
    proposer = forms.ChoiceField(required=False, label="proposer")
    # A list of the likely starts, or any candidate by its number: the run's
    # creation refuses one that is neither the seed nor accepted.
    start = forms.IntegerField(required=False, min_value=1, widget=forms.Select, label="start from")
    start_number = forms.IntegerField(required=False, min_value=1, label="or candidate #")

    def __init__(
        self,
        *args: Any,
        latest: Run | None = None,
        starts: list[tuple[int, str]] | None = None,
        best: str = "",
        **kwargs: Any,
    ) -> None:
        """``best`` names the experiment's best harness with its scores (``review_selectors.best_harness``)."""
        super().__init__(*args, **kwargs)
        widget = self.fields["start"].widget
        assert isinstance(widget, forms.Select)
        default = f"the experiment's best: {hidden.reveal_text(best)}" if best else "the experiment's best (the seed)"
        # An option takes no markup: a hidden character in a label shows as <U+202E>.
        widget.choices = [("", default), *((pk, hidden.reveal_text(text)) for pk, text in starts or [])]
        choices = [(name, f"preset: {name}") for name in PRESET_NAMES]
        if latest is not None:
            choices.insert(0, (f"run-{latest.pk}", f"as run #{latest.pk} ({latest.recipe.name})"))
        recipe_field = self.fields["recipe"]
        assert isinstance(recipe_field, forms.ChoiceField)
        recipe_field.choices = choices
        proposers = sorted(operators.known_operators().get("proposal", set()))
        proposer_field = self.fields["proposer"]
        assert isinstance(proposer_field, forms.ChoiceField)
        proposer_field.choices = [("", "the recipe's own"), *((name, name) for name in proposers)]

    def start_id(self) -> int | None:
        """The chosen start (a number typed wins over the list); call after ``is_valid``."""
        return self.cleaned_data.get("start_number") or self.cleaned_data.get("start")


def start_form_initial(latest: Run | None) -> dict[str, Any]:
    if latest is None:
        return {"recipe": "rrsi"}
    spec = latest.recipe.spec
    return {
        "recipe": f"run-{latest.pk}",
        "rounds": spec.get("rounds"),
        "k": spec.get("evaluation", {}).get("trials_per_task"),
        "candidates": spec.get("candidates_per_round"),
        # Keep the proposer that worked last time, also when another preset is chosen.
        "proposer": spec.get("proposal", {}).get("operator", ""),
    }


# --- Run control -----------------------------------------------------------------------


@require_POST
@access.permission_required(access.OPERATE)
def run_start(request: HttpRequest, pk: int) -> HttpResponse:
    """Start a run of a preset (or of an earlier run's recipe) with the
    form's overrides. Any error is a message and nothing is created."""
    experiment = get_object_or_404(Experiment.objects.select_related("benchmark"), pk=pk)
    dashboard = reverse("review:experiment", args=[experiment.pk])
    latest = Run.objects.filter(experiment=experiment).select_related("recipe").order_by("-pk").first()
    form = RunStartForm(request.POST, latest=latest)
    if not form.is_valid():
        problems = "; ".join(
            f"{form.fields[name].label if name in form.fields else name}: {' '.join(str(error) for error in errors)}"
            for name, errors in form.errors.items()
        )
        messages.error(request, f"The run was not started: {problems}")
        return HttpResponseRedirect(dashboard)
    data = form.cleaned_data
    try:
        run = lifecycle.run_start(
            experiment=experiment,
            recipe=data["recipe"],
            rounds=data["rounds"],
            k=data["k"],
            candidates_per_round=data["candidates"],
            proposer=data["proposer"] or None,
            start=form.start_id(),
            user=request.user,
        )
    except lifecycle.LoopError as exc:
        messages.error(request, f"The run was not started: {exc}")
        return HttpResponseRedirect(dashboard)
    spec = run.recipe.spec
    messages.success(
        request,
        f"Run #{run.pk} started: recipe {run.recipe.name}, {run.rounds} round(s), "
        f"k={spec['evaluation']['trials_per_task']}, {spec['candidates_per_round']} candidate(s) per round, "
        f"from candidate #{run.start_candidate_id}, proposer {spec['proposal']['operator']}.",
    )
    return HttpResponseRedirect(f"{dashboard}?run={run.pk}")


@require_POST
@access.permission_required(access.OPERATE)
def run_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    """Pause, resume or cancel a run; a run in the wrong state is a message."""
    if action not in RUN_ACTIONS:
        raise Http404(f"unknown run action {action!r}")
    run = get_object_or_404(Run.objects.all(), pk=pk)
    done, refusal = RUN_ACTIONS[action]
    if action == "pause":
        changed = lifecycle.run_pause(run=run)
    elif action == "resume":
        changed = lifecycle.run_resume(run=run)
    else:
        changed = lifecycle.run_cancel(run=run, reason=f"cancelled by {request.user.get_username()}")
    if changed:
        messages.success(request, f"Run #{run.pk} {done}.")
    else:
        run.refresh_from_db(fields=["status"])
        messages.error(request, f"Run #{run.pk} was not {done}: it is {run.status}, and {refusal}.")
    return HttpResponseRedirect(f"{reverse('review:experiment', args=[run.experiment_id])}?run={run.pk}")


urlpatterns = [
    path("experiments/<int:pk>/runs/start/", run_start, name="run_start"),
    path("runs/<int:pk>/<str:action>/", run_action, name="run_action"),
]
