"""Candidate page, side-by-side diff, raw files and certified records.

Views parse the request, call one page builder (``review.pages.candidate``,
``.diff``, ``.record``), and render. Nothing here writes evolution state; the
only write is the reviewer's own "viewed" mark (``review.models.ViewedFile``).
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib import messages
from django.db import IntegrityError, transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.utils.cache import patch_vary_headers
from django.utils.http import content_disposition_header, url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from evolution import access, hidden_chars
from evolution.loop import late
from evolution.loop.review import review_settle_due
from evolution.models import (
    Candidate,
    TreeEntry,
)
from evolution.services.records import records_verify
from review import diffs
from review import selectors as review_selectors
from review.http import HtmxHttpRequest
from review.models import ViewedFile
from review.pages import BadInput, diff
from review.pages import candidate as pages
from review.pages import record as record_pages

DIGEST_RE = re.compile(r"^(?:[0-9a-f]{64})?$")


@require_GET
@access.permission_required()
def candidate(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Screen 3: one candidate, why the gate decided what it did, its edits,
    flags and per-split results (aggregates only), with its diff embedded.

    The diff's "compare with" and layout choices are in the URL; the form
    that changes them (htmx) gets only the embedded diff's placeholder back
    and pushes the URL, so a reload keeps them."""
    against, layout = request.GET.get("against", ""), request.GET.get("layout", "")
    if request.htmx and request.htmx.target == "diff-embed" and not request.htmx.history_restore_request:
        embed = pages.embedded_diff_page(pk=pk, against=against, layout=layout)
        response = render(request, "review/candidates/candidate.html#diff-embed", embed.context())
    else:
        review_settle_due(candidate_id=pk)  # a review decision whose undo window passed takes effect first
        page = pages.candidate_page(pk=pk, user=request.user, against=against, layout=layout)
        response = render(request, "review/candidates/candidate.html", page.context())
    patch_vary_headers(response, ["HX-Request", "HX-Target"])
    return response


@require_POST
@access.permission_required(access.OPERATE)
def candidate_evaluate(request: HttpRequest, pk: int) -> HttpResponse:
    """Evaluate a candidate on the gate's splits or on every split (``evolution.loop.late``): an approved one
    left behind by its run is evaluated and gated; a decided one is measured where it has no trials yet. A
    refusal is a message and changes nothing."""
    cand = get_object_or_404(Candidate.objects.all(), pk=pk)
    scope = request.POST.get("scope", "gate")
    try:
        outcome = late.candidate_evaluate_late(candidate_id=cand.pk, scope=scope)
    except late.LateError as exc:
        messages.error(request, f"Not evaluated: {exc}.")
    else:
        messages.success(request, f"{outcome.message[:1].upper()}{outcome.message[1:]}.")
    return redirect("review:candidate", pk=cand.pk)


# --- Diff ---------------------------------------------------------------------------


def _parse_diff_request(request: HttpRequest, pk: int) -> diff.DiffRequest:
    cand = get_object_or_404(Candidate.objects.select_related("experiment", "parent"), pk=pk)
    layout = request.GET.get("layout") or diffs.DEFAULT_LAYOUT
    if layout not in diffs.LAYOUTS:
        raise BadInput(f"layout must be one of {', '.join(diffs.LAYOUTS)}, not {layout[:40]!r}")
    raw = request.GET.get("against", "").strip()
    if not raw:
        return diff.DiffRequest(cand, cand.parent, layout, True)
    if not raw.isdigit():
        raise BadInput(f"against must be a candidate number, not {raw[:40]!r}")
    against = Candidate.objects.filter(pk=int(raw), experiment_id=cand.experiment_id).first()
    if against is None:
        raise BadInput(f"candidate {raw} is not a candidate of experiment {cand.experiment.name!r}")
    return diff.DiffRequest(cand, against, layout, against.pk == cand.parent_id)


@require_GET
@access.permission_required()
def candidate_diff(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Screen 4: the diff against the parent (or ``?against=``), split or
    unified (``?layout=``); ``?partial=1`` gives only the diff body.

    The first response diffs only the files it renders. ``?counts=1`` counts
    the lines of the collapsed files too: an htmx request (the page sends it
    once loaded) gets only the counts, swapped into their placeholders; a
    plain request the whole page with every count."""
    try:
        req = _parse_diff_request(request, pk)
    except BadInput as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    counts, partial, here = bool(request.GET.get("counts")), bool(request.GET.get("partial")), request.get_full_path()
    if counts and request.htmx:
        page = diff.diff_counts_page(req=req, here=here)
        return render(request, "review/candidates/diff.html#diff-counts", page.context())
    page = diff.diff_page(user=request.user, req=req, here=here, count_all=counts, choices=not partial)
    return render(request, "review/candidates/diff.html" + ("#diff-body" if partial else ""), page.context())


@require_GET
@access.permission_required()
def diff_file(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """One file of a diff in full (what a collapsed file's "Load diff" fetches)."""
    try:
        req = _parse_diff_request(request, pk)
    except BadInput as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    wanted = request.GET.get("path", "")
    if not wanted:
        return HttpResponseBadRequest("path is required", content_type="text/plain; charset=utf-8")
    alone = not request.htmx
    page = diff.diff_page(
        user=request.user, req=req, here=request.get_full_path(), only_path=wanted, choices=alone, single=alone
    )
    if request.htmx:
        # The file's body, and its counts wherever the page still waits for them.
        return render(request, "review/candidates/diff.html#file-load", {**page.context(), "f": page.files[0]})
    return render(request, "review/candidates/diff.html", page.context())


# An expansion shows at most this many lines (a whole file's context is one click, not unbounded work).
CONTEXT_MAX_LINES = 5000


@require_GET
@access.permission_required()
def diff_context(request: HttpRequest, pk: int) -> HttpResponse:
    """Unchanged lines of one file of the candidate, read from its stored
    tree, as diff rows (``?path=&layout=&first=&last=&shift=``): what the
    "expand" buttons of a diff fetch. ``shift`` numbers the old side."""
    cand = get_object_or_404(Candidate, pk=pk)
    file_path = request.GET.get("path", "")
    layout = request.GET.get("layout") or diffs.DEFAULT_LAYOUT
    try:
        first, last, shift = (int(request.GET.get(name, "")) for name in ("first", "last", "shift"))
    except ValueError:
        return HttpResponseBadRequest(
            "first, last and shift must be integers", content_type="text/plain; charset=utf-8"
        )
    if not file_path or layout not in diffs.LAYOUTS or first < 1 or last < first or last - first >= CONTEXT_MAX_LINES:
        return HttpResponseBadRequest(
            f"path, a layout and 1 <= first <= last (at most {CONTEXT_MAX_LINES} lines) are required",
            content_type="text/plain; charset=utf-8",
        )
    data = review_selectors.tree_file(candidate=cand, path=file_path)
    if data is None:
        raise Http404("no such file in this candidate")
    _flags_shown, marks = diff.leak_marks(cand, request.user)
    rows = diffs.context_rows(
        new_data=data,
        path=file_path,
        layout=layout,
        first=first,
        last=last,
        shift=shift,
        anchor=diffs.file_anchor(file_path),
        marks=marks.get(file_path, []),
    )
    return HttpResponse(rows, content_type="text/html; charset=utf-8")


@require_POST
@access.permission_required()
def diff_viewed(request: HtmxHttpRequest) -> HttpResponse:
    """Mark one file of a diff viewed or not viewed for the signed-in user.

    The mark is keyed by the blob digests of both sides, so it stops
    applying as soon as either side of the file changes. ``viewed`` = 1/0
    sets the state; without it the mark is toggled. Safe to repeat with
    ``viewed``; concurrent duplicates are absorbed by the unique constraint.
    """
    file_path = request.POST.get("path", "")
    old_digest = request.POST.get("old_digest", "")
    new_digest = request.POST.get("new_digest", "")
    if not file_path or len(file_path) > 1024:
        return HttpResponseBadRequest("path must be 1 to 1024 characters", content_type="text/plain; charset=utf-8")
    if not DIGEST_RE.match(old_digest) or not DIGEST_RE.match(new_digest) or not (old_digest or new_digest):
        return HttpResponseBadRequest(
            "old_digest and new_digest must be SHA-256 hex digests (one may be empty)",
            content_type="text/plain; charset=utf-8",
        )
    keys: dict[str, Any] = {"user": request.user, "path": file_path, "old_digest": old_digest, "new_digest": new_digest}
    wanted = request.POST.get("viewed")
    with transaction.atomic():
        existing = ViewedFile.objects.filter(**keys)
        target = (wanted in ("1", "on", "true")) if wanted is not None else not existing.exists()
        if target:
            try:
                with transaction.atomic():
                    ViewedFile.objects.get_or_create(**keys)
            except IntegrityError:
                pass  # a concurrent request marked it first: the state we want
        else:
            existing.delete()
    if request.htmx:
        state = {
            "path": file_path,
            "old_digest": old_digest,
            "new_digest": new_digest,
            "viewed": target,
            "anchor": diffs.file_anchor(file_path),
        }
        here = request.POST.get("next", "").split("#")[0]
        return render(request, "review/candidates/diff.html#viewed-form", {"f": state, "here": here})
    next_url = request.POST.get("next", "")
    if next_url and url_has_allowed_host_and_scheme(next_url, {request.get_host()}, request.is_secure()):
        return redirect(next_url)
    return redirect("review:home")


@require_GET
@access.permission_required()
def candidate_raw(request: HttpRequest, pk: int, path: str) -> HttpResponse:
    """One file of the candidate's tree as plain text, never interpreted.

    The bytes are exact, so a file holding hidden characters (bidi controls,
    zero-width...) is sent as a download, never shown inline: a browser
    would apply them. The diff shows them as markers."""
    cand = get_object_or_404(Candidate, pk=pk)
    entry = TreeEntry.objects.filter(tree_id=cand.tree_id, path=path).select_related("blob").first()
    if entry is None:
        raise Http404("no such file in this candidate")
    data = bytes(entry.blob.content)
    response = HttpResponse(data, content_type="text/plain; charset=utf-8")
    hidden = bool(hidden_chars.bytes_hidden(data))
    disposition = content_disposition_header(hidden, path.rsplit("/", 1)[-1])
    if disposition is not None:  # None only for an empty name, which no tree entry has
        response.headers["Content-Disposition"] = disposition
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


# --- Record page --------------------------------------------------------------------


@require_GET
@access.permission_required()
def record(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """A certified record: what it binds, whether it checks out on its own,
    and its payload (sealed per-task rows only with the permission).

    ``?verify=1`` also runs the full verification of the record's experiment
    (chain, trees, evaluator, task sets, trial rows). It is read-only but its
    work grows with the experiment, so it runs on request only; an htmx
    request gets just the report."""
    rec = record_pages.certified_record(pk=pk)
    report = records_verify(experiment=rec.experiment) if request.GET.get("verify") else None
    if report is not None and request.htmx:
        return render(request, "review/candidates/record.html#verify-report", {"report": report, "record": rec})
    page = record_pages.record_page(record=rec, user=request.user, report=report)
    return render(request, "review/candidates/record.html", page.context())


urlpatterns = [
    path("candidates/<int:pk>/", candidate, name="candidate"),
    path("candidates/<int:pk>/evaluate/", candidate_evaluate, name="candidate_evaluate"),
    path("candidates/<int:pk>/diff/", candidate_diff, name="candidate_diff"),
    path("candidates/<int:pk>/diff/file/", diff_file, name="diff_file"),
    path("candidates/<int:pk>/diff/context/", diff_context, name="diff_context"),
    path("candidates/<int:pk>/raw/<path:path>", candidate_raw, name="candidate_raw"),
    path("diff/viewed/", diff_viewed, name="diff_viewed"),
    path("records/<int:pk>/", record, name="record"),
]
