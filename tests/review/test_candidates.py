"""Screens 3 and 4: the candidate page, the diff, raw files, viewed marks
and certified records, on the real example world."""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from evolution import access, selectors
from evolution.models import (
    AtomicEdit,
    Candidate,
    CertifiedDecision,
    CertifiedResult,
    Evaluation,
    Experiment,
    GateDecision,
    LeakageFlag,
    SplitMembership,
    SplitName,
)
from evolution.services.snapshots import tree_entries, tree_store
from evolution.trees import FileEntry
from review import diffs
from review.models import ViewedFile
from review.pages.candidate import RULE_WORDS, delta_text, gate_summary
from tests.factories import seed_of
from tests.review.world import grow

pytestmark = pytest.mark.django_db

XSS = "</script><img src=x onerror=alert(1)>"
HTMX = {"HTTP_HX_REQUEST": "true"}


def child(parent: Candidate, changes: Mapping[str, str | bytes | None], *, label: str = "", **fields) -> Candidate:
    """A new candidate of ``parent``'s experiment: its files with ``changes``
    applied (None deletes a path)."""
    files = {entry.path: entry for entry in tree_entries(tree=parent.tree)}
    for path, data in changes.items():
        if data is None:
            files.pop(path, None)
        else:
            files[path] = FileEntry(path, "100644", data.encode() if isinstance(data, str) else data)
    tree = tree_store(entries=list(files.values()))
    fields.setdefault("state", Candidate.State.REJECTED_GATE)
    return Candidate.objects.create(
        experiment=parent.experiment,
        parent=parent,
        tree=tree,
        origin=Candidate.Origin.PROPOSED,
        label=label,
        run=parent.run,
        round=(parent.round or 0) + 1,
        **fields,
    )


def csrf_post(client, url: str, data: dict, **extra):
    client.get(reverse("review:home"))
    token = client.cookies["csrftoken"].value
    return client.post(url, data, HTTP_X_CSRFTOKEN=token, **extra)


def page(response) -> str:
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


# --- Candidate page -------------------------------------------------------------------


def test_candidate_page_explains_the_gate_in_words_and_numbers(example_world, client_as) -> None:
    decision = (
        GateDecision.objects.filter(candidate__experiment=example_world, candidate__origin="proposed", accepted=True)
        .select_related("candidate")
        .first()
    )
    assert decision is not None
    cand = decision.candidate
    html = page(client_as("viewer").get(reverse("review:candidate", args=[cand.pk])))

    assert f'decided by rule <span class="rule">{decision.rule}</span>' in html
    assert escape(RULE_WORDS[decision.rule]) in html
    assert escape(decision.explanation) in html
    numbers = decision.numbers
    summary = gate_summary(numbers)
    assert f"dS = {numbers['dS']:+.3f}" in summary and f"dC = {numbers['dC'] * 100:+.1f}%" in summary
    assert summary in html
    assert f"novelty N_new = {numbers['N_new']}" in html
    assert "S_best: best accepted score so far" in html
    assert f"{numbers['S_best']:.3f} ({numbers['S_best'] * 100:.2f} points)" in html
    if decision.chosen:
        assert "chosen as next harness" in html
    # Each decision names its run (a candidate can join several runs' gates).
    assert f"<strong>Run {decision.run_id}, round {decision.round}:</strong>" in html


def test_candidate_page_renders_the_diff_choices_its_url_names(example_world, client_as) -> None:
    seed = seed_of(example_world)
    base = child(seed, {"a.py": "a = 1\n"})
    cand = child(base, {"a.py": "a = 2\n"})
    client = client_as("viewer")
    url = reverse("review:candidate", args=[cand.pk])
    diff_url = reverse("review:candidate_diff", args=[cand.pk])

    html = page(client.get(url, {"against": base.pk, "layout": "unified"}))
    assert f'<option value="{base.pk}" selected>' in html
    assert '<option value="unified" selected>' in html
    assert f'hx-get="{diff_url}?partial=1&amp;against={base.pk}&amp;layout=unified"' in html
    assert 'hx-push-url="true"' in html
    # Unknown values fall back to the parent and the split layout.
    html = page(client.get(url, {"against": "999999", "layout": "sideways"}))
    assert " selected>" not in html.split('name="against"')[1].split("</select>")[0]
    assert f'hx-get="{diff_url}?partial=1"' in html
    # The form's htmx request gets only the embedded diff's placeholder.
    part = page(client.get(url, {"against": base.pk, "layout": "split"}, HTTP_HX_TARGET="diff-embed", **HTMX))
    assert part.strip().startswith('<div id="diff-embed"')
    assert f'hx-get="{diff_url}?partial=1&amp;against={base.pk}&amp;layout=split"' in part
    assert "Gate decision" not in part


def test_candidate_page_shows_identity_edits_and_links(example_world, client_as) -> None:
    cand = (
        Candidate.objects.filter(experiment=example_world, state=Candidate.State.ACCEPTED, origin="proposed")
        .order_by("pk")
        .first()
    )
    assert cand is not None
    html = page(client_as("viewer").get(reverse("review:candidate", args=[cand.pk])))
    assert cand.tree_id in html and f'data-copy="{cand.tree_id}"' in html
    assert reverse("review:candidate", args=[cand.parent_id]) in html
    assert reverse("review:lineage", args=[example_world.pk]) in html
    assert reverse("review:matrix", args=[example_world.pk]) in html
    assert escape(cand.state_reason) in html
    edits = list(AtomicEdit.objects.filter(candidate=cand))
    assert edits
    diff_url = reverse("review:candidate_diff", args=[cand.pk])
    for edit in edits:
        assert escape(edit.hypothesis) in html
        assert f'<span class="mono">{edit.component}</span>' in html
        for path in edit.paths:
            assert f'href="{diff_url}#{diffs.file_anchor(path)}"' in html
    for kid in Candidate.objects.filter(parent=cand):
        assert reverse("review:candidate", args=[kid.pk]) in html


def test_candidate_page_labels_rate_and_contribution_and_shows_the_ci(example_world, client_as) -> None:
    cand = (
        Candidate.objects.filter(experiment=example_world, state=Candidate.State.ACCEPTED, origin="proposed")
        .order_by("pk")
        .first()
    )
    assert cand is not None
    result = selectors.candidate_metrics(candidate=cand)
    html = page(client_as("viewer").get(reverse("review:candidate", args=[cand.pk])))

    assert 'rate<span class="metric-label">passed ÷ trials in this split</span>' in html
    assert 'contribution<span class="metric-label">passed ÷ trials of the whole benchmark</span>' in html
    for split, summary in result.splits.items():
        row = re.search(rf'<span class="split {split}">{split}</span></td>(.*?)</tr>', html, re.S)
        assert row, split
        cells = row.group(1)
        assert f"{summary.rate * 100:.1f}%" in cells and f"{summary.contribution * 100:.1f}%" in cells
        assert f"{summary.pass_at_k * 100:.1f}%" in cells and f"{summary.pass_hat_k * 100:.1f}%" in cells
        assert f"{summary.mean_tokens:,.0f}" in cells
    # A rate and a contribution of one split differ (train is a part of the benchmark).
    train = result.splits[SplitName.TRAIN]
    assert f"{train.rate * 100:.1f}%" != f"{train.contribution * 100:.1f}%"
    assert result.delta is not None and result.delta.estimate.enough
    assert delta_text(result.delta) in html
    assert "CI" in delta_text(result.delta) and f"over {result.delta.estimate.pairs} paired tasks" in html
    overall = sum(s.contribution for k, s in result.splits.items() if k != SplitName.HELDOUT)
    assert f"sum of the contributions = {overall * 100:.1f}%" in html


def test_the_candidate_page_and_the_runs_card_give_the_steps_tokens_in_money(
    example_world, client_as, settings, tmp_path
) -> None:
    """Issue 40, defect 8: cost in money where tokens are shown, summed from the steps' prompt and completion
    tokens at each step model's price (the trial page's table); what has no price says why."""
    import json  # noqa: PLC0415

    from evolution.measurements import counted_trials  # noqa: PLC0415
    from evolution.models import TrajectoryStep  # noqa: PLC0415

    cand = Candidate.objects.filter(experiment=example_world, state="accepted", origin="proposed").first()
    assert cand is not None
    steps = TrajectoryStep.objects.filter(trajectory__trial__in=counted_trials(candidate_id=cand.pk))
    models = sorted({name for name in steps.values_list("model_name", flat=True) if name})
    assert models, "the example's steps name their model"
    table = tmp_path / "prices.json"
    prices = {m: {"input_per_mtok": 2.0 + k, "output_per_mtok": 10.0 + k} for k, m in enumerate(models)}
    table.write_text(json.dumps({"models": prices}))
    settings.RSI_PRICE_TABLE = str(table)
    expected = 0.0
    for name, metrics in steps.values_list("model_name", "metrics"):  # every step, read and priced one by one
        price = prices.get(name)
        if price and isinstance(metrics, dict):
            expected += metrics.get("prompt_tokens", 0) * price["input_per_mtok"] / 1e6
            expected += metrics.get("completion_tokens", 0) * price["output_per_mtok"] / 1e6
    assert expected > 0
    client = client_as("viewer")
    url = reverse("review:candidate", args=[cand.pk])
    money = re.search(r'<p class="small" id="candidate-money">(.*?)</p>', page(client.get(url)), re.S)
    assert money and f"≈ ${expected:.4f}</span>" in money.group(1) and "no price" not in money.group(1)

    # A model the table does not price, and steps that name no model, are left out and said so.
    first = steps.filter(metrics__has_key="prompt_tokens").order_by("pk").first()
    assert first is not None
    tokens = first.metrics["prompt_tokens"] + first.metrics.get("completion_tokens", 0)
    TrajectoryStep.objects.filter(pk=first.pk).update(model_name="")
    money = re.search(r'<p class="small" id="candidate-money">(.*?)</p>', page(client.get(url)), re.S)
    assert money and f"{tokens:,} tokens of 1 step name no model: no price" in money.group(1)
    settings.RSI_PRICE_TABLE = str(tmp_path / "empty.json")
    (tmp_path / "empty.json").write_text(json.dumps({"models": {}}))
    money = re.search(r'<p class="small" id="candidate-money">(.*?)</p>', page(client.get(url)), re.S)
    assert money and "no money cost" in money.group(1)
    assert f"no price for {models[0]} in the price table" in money.group(1)

    # The run's card: the run's steps at the same prices.
    settings.RSI_PRICE_TABLE = str(table)
    run = cand.run
    assert run is not None
    html = page(client.get(reverse("review:experiment", args=[example_world.pk]) + f"?run={run.pk}"))
    card = re.search(r'<dd id="run-money">(.*?)</dd>', html, re.S)
    assert card and "≈ $" in card.group(1) and "name no model: no price" in card.group(1)


def test_candidate_page_links_to_its_verified_records(example_world, client_as) -> None:
    seed = seed_of(example_world)
    records = list(CertifiedResult.objects.filter(candidate=seed).order_by("seq"))
    assert len(records) >= 2
    html = page(client_as("viewer").get(reverse("review:candidate", args=[seed.pk])))
    for record in records:
        assert f'href="{reverse("review:record", args=[record.pk])}"' in html
    # One summary badge in the header, not one a record (issue 40 item 9).
    assert html.count('class="badge certified"') == 1
    assert f"certified ✓ {len(records)} records</a>" in html
    assert html.count('<span class="badge ok">verified</span>') == len(records)
    assert "certification fails" not in html


def forged_record(world: Experiment, payload: object) -> CertifiedResult:
    """A record appended to ``world``'s chain for its seed, with ``payload``
    and a digest and signature nobody computed."""
    seed = seed_of(world)
    evaluation = Evaluation.objects.create(
        experiment=world, candidate=seed, purpose=Evaluation.Purpose.NOISE, state=Evaluation.State.CERTIFIED
    )
    return CertifiedResult.objects.create(
        experiment=world,
        seq=world.chain_length + 1,
        evaluation=evaluation,
        candidate=seed,
        payload=payload,
        prev_digest=world.chain_head,
        record_digest="f" * 64,
        signature="0" * 64,
    )


def test_a_forged_record_shows_as_failing_on_the_candidate_and_record_pages(example_world, client_as) -> None:
    seed = seed_of(example_world)
    good = CertifiedResult.objects.filter(candidate=seed).order_by("seq").first()
    assert good is not None
    forged = forged_record(example_world, {**good.payload, "seq": example_world.chain_length + 1})
    client = client_as("viewer")
    html = page(client.get(reverse("review:candidate", args=[seed.pk])))
    assert f"certification fails ✗ record #{forged.seq}" in html
    html = page(client.get(reverse("review:record", args=[forged.pk])))
    assert "verification fails ✗" in html
    assert re.search(r'<li class="fail"><strong>payload digest</strong>', html)
    assert re.search(r'<li class="fail"><strong>signature</strong>', html)
    assert re.search(r'<li class="fail"><strong>names its predecessor</strong>', html)


def test_a_record_after_a_decision_record_links_to_it_on_the_record_page(example_world, client_as) -> None:
    # Decisions share the chain: the record before an evaluation may be a gate decision.
    evaluations = set(CertifiedResult.objects.filter(experiment=example_world).values_list("seq", flat=True))
    decisions = CertifiedDecision.objects.filter(experiment=example_world, kind="gate").order_by("seq")
    decision = next(d for d in decisions if d.seq + 1 in evaluations)
    record = CertifiedResult.objects.get(experiment=example_world, seq=decision.seq + 1)
    html = page(client_as("viewer").get(reverse("review:record", args=[record.pk])))
    assert "record checks out ✓" in html
    assert f"record #{decision.seq} has digest {decision.record_digest[:16]}…" in html
    assert '<li class=""><strong>links to the record before it</strong>' in html


def test_a_record_whose_payload_is_not_an_object_shows_as_failing(example_world, client_as) -> None:
    forged = forged_record(example_world, ["not", "an", "object"])
    for client in (client_as("viewer"), client_as("viewer", username="sealer", extra_perms=(access.SEALED,))):
        html = page(client.get(reverse("review:record", args=[forged.pk])))
        assert "verification fails ✗" in html
        assert re.search(r'<li class="fail"><strong>names this record</strong>', html)
        assert "payload is not a JSON object" in html


def test_flagged_candidate_page_lists_its_flags_and_hides_sealed_tasks(example_world, client_as) -> None:
    flag = LeakageFlag.objects.filter(candidate__experiment=example_world, task__isnull=False).first()
    assert flag is not None
    cand = flag.candidate
    viewer = client_as("viewer")
    html = page(viewer.get(reverse("review:candidate", args=[cand.pk])))
    assert f"Leakage flags ({cand.leakage_flags.count()})" in html
    assert flag.task is not None
    assert flag.rule in html and flag.task.external_id in html  # an evolve task: visible

    # The same flag pointing at a sealed task hides the task from a plain viewer.
    sealed = SplitMembership.objects.filter(experiment=example_world, split=SplitName.SEALED).select_related("task")
    sealed_task = sealed.order_by("pk")[0].task
    LeakageFlag.objects.filter(pk=flag.pk).update(task=sealed_task, matched="sealed-needle-text")
    html = page(viewer.get(reverse("review:candidate", args=[cand.pk])))
    # Nor the text it matched: which words matched tells what the sealed task says.
    assert "sealed-needle-text" not in html and "hidden: from a sealed task" in html and "sealed task (hidden)" in html
    assert sealed_task.external_id not in html
    html = page(client_as("admin").get(reverse("review:candidate", args=[cand.pk])))
    assert sealed_task.external_id in html and '<mark class="leak">sealed-needle-text</mark>' in html


def test_candidate_page_shows_no_sealed_per_task_data(example_world, client_as) -> None:
    seed = seed_of(example_world)
    sealed_ids = list(
        SplitMembership.objects.filter(experiment=example_world, split=SplitName.SEALED).values_list(
            "task__external_id", flat=True
        )
    )
    html = page(client_as("viewer").get(reverse("review:candidate", args=[seed.pk])))
    assert '<span class="split sealed">sealed</span>' in html  # the aggregate row is there
    for task_id in sealed_ids:
        assert task_id not in html


def test_untrusted_text_renders_as_text_on_the_candidate_page_and_diff(example_world, client_as) -> None:
    seed = seed_of(example_world)
    payload = f"{XSS} {{{{ candidate.pk }}}} {{% now 'Y' %}}"
    cand = child(seed, {"prompts/evil.md": f"# {payload}\n", "x.py": f"s = '{payload}'\n"}, label=payload)
    AtomicEdit.objects.create(candidate=cand, index=0, component="prompt", hypothesis=payload, paths=["x.py"])
    LeakageFlag.objects.create(candidate=cand, rule="task_id", path="x.py", matched=XSS, line=payload)
    client = client_as("viewer")
    for url in (
        reverse("review:candidate", args=[cand.pk]),
        reverse("review:candidate_diff", args=[cand.pk]),
        reverse("review:candidate_diff", args=[cand.pk]) + "?layout=unified",
        reverse("review:candidate_diff", args=[cand.pk]) + "?partial=1",
    ):
        html = page(client.get(url))
        assert "<img src=x" not in html and "</script><img" not in html, url
        assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in html, url
        assert "{{ candidate.pk }}" in html, url  # template syntax in data stays literal
        assert "{% now &#x27;Y&#x27; %}" in html, url


# --- Diff -------------------------------------------------------------------------------


def test_diff_against_the_parent_shows_files_counts_statuses_and_line_numbers(example_world, client_as) -> None:
    seed = seed_of(example_world)
    first = tree_entries(tree=seed.tree)[0]
    cand = child(seed, {first.path: None, "new/added.py": "def added():\n    return 1\n"})
    client = client_as("viewer")
    html = page(client.get(reverse("review:candidate_diff", args=[cand.pk]) + "?layout=unified"))
    assert "2 files changed" in html
    assert f'<a href="#{diffs.file_anchor("new/added.py")}">new/added.py</a>' in html
    assert f'id="{diffs.file_anchor(first.path)}"' in html
    assert '<span class="badge status-added">added</span>' in html
    assert '<span class="badge status-deleted">deleted</span>' in html
    added = diffs.file_anchor("new/added.py")
    # Line numbers are permalinks: "#<file>-R1" is line 1 of the new side.
    cell = f'<td class="no" id="{added}-R1"><a href="#{added}-R1">1</a></td>'
    assert f'<tr class="add"><td class="no"></td>{cell}' in html
    assert '<span class="k">def</span>' in html and "layout-unified" in html
    removed_lines = first.data.decode().count("\n")
    anchor = diffs.file_anchor(first.path)
    assert f'<td class="num minus"><span id="{anchor}-list-removed">−{removed_lines}</span></td>' in html
    assert 'hx-trigger="load"' not in html  # every file rendered: nothing left to count
    # The deleted file's raw link points at the side that still has it.
    assert reverse("review:candidate_raw", args=[seed.pk, first.path]) in html

    split = page(client.get(reverse("review:candidate_diff", args=[cand.pk])))
    assert "layout-split" in split and "layout-unified" not in split
    cell = f'<td class="no add" id="{added}-R1"><a href="#{added}-R1">1</a></td>'
    assert f'<td class="no empty"></td><td class="code empty"></td>{cell}' in split


def test_diff_against_any_candidate_of_the_experiment(example_world, client_as) -> None:
    seed = seed_of(example_world)
    a = child(seed, {"notes/a.txt": "alpha\n"})
    b = child(seed, {"notes/b.txt": "beta\n"})
    client = client_as("viewer")
    html = page(client.get(reverse("review:candidate_diff", args=[b.pk]) + f"?against={a.pk}"))
    assert "notes/a.txt" in html and "notes/b.txt" in html
    assert f'<option value="{a.pk}" selected>' in html
    assert "2 files changed" in html

    bad = client.get(reverse("review:candidate_diff", args=[b.pk]) + "?against=999999")
    assert bad.status_code == 400 and b"is not a candidate of experiment" in bad.content
    assert client.get(reverse("review:candidate_diff", args=[b.pk]) + "?against=x1").status_code == 400
    assert client.get(reverse("review:candidate_diff", args=[b.pk]) + "?layout=sideways").status_code == 400


def test_seed_diff_is_against_the_empty_tree(example_world, client_as) -> None:
    seed = seed_of(example_world)
    files = tree_entries(tree=seed.tree)
    html = page(client_as("viewer").get(reverse("review:candidate_diff", args=[seed.pk])))
    assert f"{len(files)} files changed" in html
    assert "the empty tree" in html
    assert html.count('<span class="badge status-added">added</span>') >= len(files)


def test_rename_binary_and_mode_changes_are_shown_explicitly(example_world, client_as) -> None:
    seed = seed_of(example_world)
    entries = {e.path: e for e in tree_entries(tree=seed.tree)}
    renamed_from = next(iter(entries))
    base = child(seed, {"bin/blob.dat": b"\0\1\2", "bin/run.sh": "echo\n"})
    entries = {e.path: e for e in tree_entries(tree=base.tree)}
    moved = entries.pop(renamed_from)
    entries["moved/" + renamed_from] = FileEntry("moved/" + renamed_from, moved.mode, moved.data)
    entries["bin/blob.dat"] = FileEntry("bin/blob.dat", "100644", b"\0\1\3\4")
    entries["bin/run.sh"] = FileEntry("bin/run.sh", "100755", b"echo\n")
    tree = tree_store(entries=list(entries.values()))
    cand = Candidate.objects.create(
        experiment=example_world, parent=base, tree=tree, origin="proposed", state="rejected_gate"
    )
    html = page(client_as("viewer").get(reverse("review:candidate_diff", args=[cand.pk])))
    assert f'Renamed from <span class="mono">{renamed_from}</span> without changes to its content.' in html
    assert '<span class="badge status-renamed">renamed</span>' in html
    assert "Binary file" not in html
    assert (
        "Not UTF-8 text: the file holds 1 NUL byte; its previous version held 1 NUL byte (3 → 4 bytes), so no "
        "line diff is shown. The leakage critic and the hidden-character check read the text it holds all the "
        "same, and flag those bytes."
    ) in html
    assert "Only the file mode changed: 100644 → 100755." in html
    assert '<span class="badge status-mode neutral">mode 100644 → 100755</span>' in html


def test_leak_marks_in_the_diff_keep_escaping_intact(example_world, client_as) -> None:
    seed = seed_of(example_world)
    needle = '<b>route-017</b> & "x"'
    cand = child(seed, {"notes/leak.txt": f"before\nsee {needle} here\nafter {needle}\n"})
    LeakageFlag.objects.create(candidate=cand, rule="task_id", path="notes/leak.txt", matched=needle, line="")
    LeakageFlag.objects.create(candidate=cand, rule="rare_literal", path="notes/other.txt", matched="zzz", line="")
    html = page(client_as("viewer").get(reverse("review:candidate_diff", args=[cand.pk]) + "?layout=unified"))
    escaped = "&lt;b&gt;route-017&lt;/b&gt; &amp; &quot;x&quot;"
    marked = f'<mark class="leak" title="leakage flag: rule task_id">{escaped}</mark>'
    assert html.count(marked) == 2  # both added lines
    assert "<b>route-017</b>" not in html
    assert "2 leakage flags on candidate" in html
    assert re.search(r'<td class="mono"><mark class="leak">&lt;b&gt;route-017', html)  # the legend


def test_viewed_mark_persists_toggles_and_resets_when_the_file_changes(example_world, client_as) -> None:
    seed = seed_of(example_world)
    path = "notes/review.md"
    first = child(seed, {path: "version one\n"})
    second = child(seed, {path: "version two\n"})
    client = client_as("viewer")
    url = reverse("review:candidate_diff", args=[first.pk])
    html = page(client.get(url))
    fd = next(f for f in diffs.build_file_diffs(tree_entries(tree=seed.tree), tree_entries(tree=first.tree)))
    assert fd.path == path
    assert 'class="js-viewed" name="viewed" value="1" checked' not in html

    data = {"path": path, "old_digest": fd.old_digest, "new_digest": fd.new_digest, "viewed": ["0", "1"]}
    response = csrf_post(client, reverse("review:diff_viewed"), data, **HTMX)
    assert response.status_code == 200
    assert 'name="viewed" value="1" checked' in response.content.decode()
    assert ViewedFile.objects.filter(path=path, new_digest=fd.new_digest).count() == 1
    html = page(client.get(url))
    assert f'class="diff-file is-viewed" id="{fd.anchor}"' in html
    assert '<span class="js-viewed-count">1</span> of 1 viewed' in html

    # Setting it twice is harmless.
    csrf_post(client, reverse("review:diff_viewed"), data, **HTMX)
    assert ViewedFile.objects.filter(path=path).count() == 1

    # The same path with other content (another candidate) is not viewed.
    other = page(client.get(reverse("review:candidate_diff", args=[second.pk])))
    assert "is-viewed" not in other
    assert '<span class="js-viewed-count">0</span> of 1 viewed' in other

    # Without an explicit state the mark toggles: off, then on again.
    toggle = {k: v for k, v in data.items() if k != "viewed"}
    csrf_post(client, reverse("review:diff_viewed"), toggle, **HTMX)
    assert not ViewedFile.objects.filter(path=path).exists()
    csrf_post(client, reverse("review:diff_viewed"), toggle, **HTMX)
    assert ViewedFile.objects.filter(path=path).count() == 1

    # Another user has their own marks.
    assert "is-viewed" not in page(client_as("reviewer").get(url))

    # Without JavaScript the form posts and comes back to the diff.
    response = csrf_post(client, reverse("review:diff_viewed"), {**data, "viewed": "0", "next": url})
    assert response.status_code == 302 and response.url == url
    assert not ViewedFile.objects.filter(path=path).exists()


def test_viewed_rejects_bad_input_and_needs_csrf(example_world, client_as) -> None:
    client = client_as("viewer")
    url = reverse("review:diff_viewed")
    bad = csrf_post(client, url, {"path": "a.md", "old_digest": "nothex", "new_digest": ""})
    assert bad.status_code == 400 and b"SHA-256" in bad.content
    assert csrf_post(client, url, {"path": "", "new_digest": "a" * 64}).status_code == 400
    assert csrf_post(client, url, {"path": "a.md", "old_digest": "", "new_digest": ""}).status_code == 400
    assert client.post(url, {"path": "a.md", "new_digest": "a" * 64, "viewed": "1"}).status_code == 403
    assert client.get(url).status_code == 405
    assert not ViewedFile.objects.exists()


def _big_pair(example_world):
    """A parent with 50 files of 200 lines and a child changing every line
    (50 x 400 = 20,000 changed lines), plus one file of 1,234 changed lines."""
    seed = seed_of(example_world)
    old = {f"big/f{n:02d}.txt": "".join(f"old line {n} {i}\n" for i in range(200)) for n in range(50)}
    old["big/huge.txt"] = "".join(f"old {i}\n" for i in range(617))
    parent = child(seed, old, state=Candidate.State.ACCEPTED, certified_at=seed.certified_at)
    new = {path: text.replace("old", "new") for path, text in old.items()}
    return child(parent, new)


def test_a_20000_line_diff_renders_only_its_budget_and_says_what_is_hidden(example_world, client_as) -> None:
    cand = _big_pair(example_world)
    client = client_as("viewer")
    response = client.get(reverse("review:candidate_diff", args=[cand.pk]) + "?layout=unified")
    html = page(response)
    rows = len(re.findall(r'<tr class="(?:add|del|ctx|hunk|eof)">', html))
    assert 0 < rows <= diffs.PAGE_BUDGET
    assert len(response.content) < 1_500_000
    assert "51 files changed" in html
    # The collapsed files are not diffed: their counts, and the totals, come from a request the page sends.
    assert "+10617" not in html and "counting the lines of 47 collapsed files" in html
    counts_url = reverse("review:candidate_diff", args=[cand.pk]) + "?layout=unified&amp;counts=1"
    assert f'id="diff-totals" hx-get="{counts_url}" hx-trigger="load" hx-swap="outerHTML"' in html

    # 4 files of 401 lines fit the 2,000-line budget; the other 46 wait, and the huge one is too large.
    budget_hidden = html.count("the page already shows its budget of 2000 lines")
    assert budget_hidden == 46
    assert "this file changes more than 400 lines" in html
    assert html.count("<strong>Changed lines hidden</strong>") == 47
    assert html.count(">Load diff</a>") == 47
    assert html.count('hx-get="/candidates/') >= 47
    huge = diffs.file_anchor("big/huge.txt")
    assert f'hx-target="#{huge}-body"' in html
    assert reverse("review:candidate_raw", args=[cand.pk, "big/huge.txt"]) in html


def test_the_first_response_diffs_only_the_files_it_renders(example_world, client_as, monkeypatch, settings) -> None:
    # A cache of its own: parses memoized by other tests would hide the diffing.
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "first"}}
    cand = _big_pair(example_world)
    diffed: list[str] = []
    parse = diffs._parse_changes

    def counting_parse(old, new, wanted):
        diffed.extend(change.path for change in wanted)
        return parse(old, new, wanted)

    monkeypatch.setattr(diffs, "_parse_changes", counting_parse)
    html = page(client_as("viewer").get(reverse("review:candidate_diff", args=[cand.pk])))
    # f00-f03 fill the budget; f04 cannot fit (at least 401 lines) and the huge file is large, both known undiffed.
    assert diffed == [f"big/f{n:02d}.txt" for n in range(4)]
    assert html.count(">Load diff</a>") == 47


def test_the_counts_request_fills_every_placeholder_with_the_exact_counts(example_world, client_as) -> None:
    cand = _big_pair(example_world)
    client = client_as("viewer")
    first = page(client.get(reverse("review:candidate_diff", args=[cand.pk])))
    url = reverse("review:candidate_diff", args=[cand.pk]) + "?counts=1"
    html = page(client.get(url, **HTMX))
    assert html.lstrip().startswith('<span class="counts" id="diff-totals"><span class="plus">+10617</span>')
    assert "−10617" in html and "hx-get" not in html and "<html" not in html
    assert html.count('hx-swap-oob="true"') == 47 * 4
    huge = diffs.file_anchor("big/huge.txt")
    for anchor, added in [(huge, 617)] + [(diffs.file_anchor(f"big/f{n:02d}.txt"), 200) for n in range(4, 50)]:
        assert f'id="{anchor}-list-added"' in first  # each swap has its placeholder on the page
        assert f'<span id="{anchor}-list-added" hx-swap-oob="true">+{added}</span>' in html
        assert f'<span id="{anchor}-list-removed" hx-swap-oob="true">−{added}</span>' in html
        counts = f'<span class="plus">+{added}</span><span class="minus">−{added}</span>'
        assert f'<span class="counts" id="{anchor}-counts" hx-swap-oob="true">{counts}</span>' in html
        assert (
            f'<span id="{anchor}-hidden" hx-swap-oob="true"><strong>{added * 2:,} changed lines hidden</strong>' in html
        )
    rendered = diffs.file_anchor("big/f00.txt")
    assert f"{rendered}-" not in html  # counted on the first response already

    # The counts equal what the loaded file shows, row by row.
    loaded = page(client.get(reverse("review:diff_file", args=[cand.pk]) + "?path=big/huge.txt&layout=unified", **HTMX))
    assert len(re.findall(r'<tr class="add">', loaded)) == 617 and len(re.findall(r'<tr class="del">', loaded)) == 617
    assert f'<span class="counts" id="{huge}-counts" hx-swap-oob="true">' in loaded

    # Without htmx, the same URL is the whole page with every count.
    full = page(client.get(url))
    assert "+10617" in full and "−10617" in full and 'hx-trigger="load"' not in full
    assert "1,234 changed lines hidden" in full and full.count("400 changed lines hidden") == 46


def test_diff_file_loads_one_collapsed_file_in_full(example_world, client_as) -> None:
    cand = _big_pair(example_world)
    client = client_as("viewer")
    url = reverse("review:diff_file", args=[cand.pk]) + "?path=big/huge.txt&layout=unified"
    html = page(client.get(url, **HTMX))
    assert html.lstrip().startswith(f'<div class="diff-file-body" id="{diffs.file_anchor("big/huge.txt")}-body">')
    assert len(re.findall(r'<tr class="add">', html)) == 617
    assert len(re.findall(r'<tr class="del">', html)) == 617
    assert "hidden" not in html
    assert "<html" not in html

    full = page(client.get(url))  # a plain link gets a whole page with that file
    assert "<html" in full and "← the whole diff" in full and full.count('<section class="diff-file') == 1
    assert client.get(reverse("review:diff_file", args=[cand.pk]) + "?path=nope.txt").status_code == 404
    assert client.get(reverse("review:diff_file", args=[cand.pk])).status_code == 400


def test_partial_diff_returns_only_the_body(example_world, client_as) -> None:
    cand = child(example_world.seed_candidate, {"notes/p.md": "partial\n"})
    html = page(client_as("viewer").get(reverse("review:candidate_diff", args=[cand.pk]) + "?partial=1"))
    assert html.lstrip().startswith('<div class="diff-body" id="diff-body">')
    assert "<html" not in html and "notes/p.md" in html and "Compare with" not in html


# --- Raw file ---------------------------------------------------------------------------


def test_raw_file_is_plain_text_never_interpreted(example_world, client_as) -> None:
    cand = child(example_world.seed_candidate, {"notes/x.html": f"<html>{XSS}</html>\n"})
    client = client_as("viewer")
    response = client.get(reverse("review:candidate_raw", args=[cand.pk, "notes/x.html"]))
    assert response.status_code == 200
    assert response.content == f"<html>{XSS}</html>\n".encode()
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"].startswith("inline")
    assert response["X-Content-Type-Options"] == "nosniff"
    assert client.get(reverse("review:candidate_raw", args=[cand.pk, "notes/missing.txt"])).status_code == 404


def test_pages_need_a_login_and_the_viewer_permission(example_world, client, make_user) -> None:
    seed = seed_of(example_world)
    url = reverse("review:candidate", args=[seed.pk])
    response = client.get(url)
    assert response.status_code == 302 and "/login/" in response.url
    client.force_login(make_user())  # no role
    assert client.get(url).status_code == 403
    assert client.get(reverse("review:candidate_diff", args=[seed.pk])).status_code == 403


# --- Record page ------------------------------------------------------------------------


def test_record_page_shows_the_chain_payload_and_checks(example_world, client_as) -> None:
    record = CertifiedResult.objects.filter(experiment=example_world, seq=2).first()
    assert record is not None
    html = page(client_as("viewer").get(reverse("review:record", args=[record.pk])))
    assert "Certified record #2" in html and "record checks out ✓" in html
    assert record.record_digest in html and record.prev_digest in html and record.signature in html
    assert "links to the record before it" in html and '<li class="fail">' not in html
    evaluator = record.payload["evaluator"]
    assert evaluator["digest"] in html
    for digest in record.payload["task_sets"].values():
        assert digest in html
    trials = record.payload["trials"]
    passed = sum(1 for t in trials if t["outcome"] == "pass" and t["split"] == SplitName.TRAIN)
    train = [t for t in trials if t["split"] == SplitName.TRAIN]
    assert re.search(
        rf'<span class="split train">train</span></td><td class="num">{len({t["task"] for t in train})}</td>'
        rf'<td class="num">{len(train)}</td><td class="num">{passed}</td>',
        html,
    )
    assert re.search(r'<pre class="payload"[^>]*>\{', html)
    assert "&quot;schema&quot;: &quot;rsiweb.certified-result/1&quot;" in html


def test_record_page_hides_sealed_rows_without_the_permission(example_world, client_as) -> None:
    record = next(
        r
        for r in CertifiedResult.objects.filter(experiment=example_world).order_by("seq")
        if any(t["split"] == SplitName.SEALED for t in r.payload["trials"])
    )
    sealed = [t for t in record.payload["trials"] if t["split"] == SplitName.SEALED]
    url = reverse("review:record", args=[record.pk])

    html = page(client_as("viewer").get(url))
    assert f"{len(sealed)} sealed per-task rows hidden" in html
    for row in sealed:
        assert f"&quot;task&quot;: &quot;{row['task']}&quot;" not in html
    passed = sum(1 for t in sealed if t["outcome"] == "pass")
    assert re.search(
        rf'<span class="split sealed">sealed</span></td><td class="num">\d+</td>'
        rf'<td class="num">{len(sealed)}</td><td class="num">{passed}</td>',
        html,
    )

    html = page(client_as("admin").get(url))
    assert "hidden" not in html.split('id="payload"')[1]
    for row in sealed:
        assert f"&quot;task&quot;: &quot;{row['task']}&quot;" in html


def test_record_page_runs_the_full_verification_on_request(example_world, client_as) -> None:
    record = CertifiedResult.objects.filter(experiment=example_world).first()
    assert record is not None
    client = client_as("viewer")
    url = reverse("review:record", args=[record.pk])
    assert "Verify the whole chain" in page(client.get(url))
    html = page(client.get(url + "?verify=1", **HTMX))
    assert html.lstrip().startswith('<div id="verify-report">')
    assert "Full verification of the experiment passes" in html


# --- Query counts -------------------------------------------------------------------------


def _queries(client, url: str) -> int:
    client.get(url)  # warm the session and permission caches alike in both worlds
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def test_query_counts_do_not_grow_with_the_experiment(example_world, client_as, django_assert_max_num_queries) -> None:
    seed = seed_of(example_world)
    flagged = Candidate.objects.filter(experiment=example_world, state=Candidate.State.FLAGGED).first()
    assert flagged is not None
    accepted = Candidate.objects.filter(experiment=example_world, state="accepted", origin="proposed").first()
    assert accepted is not None
    client = client_as("viewer")
    urls = [
        reverse("review:candidate", args=[seed.pk]),
        reverse("review:candidate", args=[flagged.pk]),
        reverse("review:candidate", args=[accepted.pk]),
        reverse("review:candidate_diff", args=[seed.pk]),
        reverse("review:candidate_diff", args=[accepted.pk]) + "?layout=unified",
        reverse("review:candidate_diff", args=[flagged.pk]) + "?partial=1",
        reverse("review:record", args=[CertifiedResult.objects.filter(candidate=seed).latest("seq").pk]),
    ]
    small = [_queries(client, url) for url in urls]
    grow(example_world, candidates=40)
    large = [_queries(client, url) for url in urls]
    assert small == large
    bound = max(small)
    for url in urls:
        with django_assert_max_num_queries(bound):
            client.get(url)
    # 23 on a flagged candidate (20 was the bound before review corrections): a page read asks for pending
    # decisions that are due (one query), the Review section reads the decision and its corrections, and the
    # steps' tokens in money are summed per model in one query.
    assert bound <= 23


def test_the_gate_the_ledger_the_page_and_the_api_give_one_ds(example_world, client_as) -> None:
    """Issue 18, item 4: for every gated candidate of the example run, the dS the gate decided on, the ledger's,
    the candidate page's and the API's are one number, with the interval of that same dS beside it."""
    from django.contrib.auth import get_user_model  # noqa: PLC0415
    from rest_framework.test import APIClient  # noqa: PLC0415

    from evolution.models import GateDecision, LedgerEntry  # noqa: PLC0415

    viewer = client_as("viewer")
    api = APIClient()
    api.force_authenticate(get_user_model().objects.get(username="viewer"))
    decisions = GateDecision.objects.filter(run__experiment=example_world, round__gt=0).order_by("pk")
    assert decisions.count() >= 3
    for decision in decisions:
        gate_ds = decision.numbers["dS"]
        for entry in LedgerEntry.objects.filter(candidate_id=decision.candidate_id):
            assert entry.delta_score == pytest.approx(gate_ds, abs=1e-12)
        found = selectors.candidate_metrics(candidate=decision.candidate).delta
        assert found is not None and found.gated and found.base_id == decision.current_id
        assert found.estimate.delta == pytest.approx(gate_ds, abs=1e-12)
        html = page(viewer.get(reverse("review:candidate", args=[decision.candidate_id])))
        assert escape(delta_text(found)) in html
        body = api.get(reverse("api:candidate-detail", args=[decision.candidate_id])).json()
        assert body["delta"]["dS"] == pytest.approx(gate_ds, abs=1e-12)
        assert body["delta"]["against"] == decision.current_id
        assert (body["delta"]["low"], body["delta"]["high"]) == (found.estimate.low, found.estimate.high)
        assert body["delta"]["paired_tasks"] == found.estimate.pairs > 0
        if found.estimate.enough:
            assert body["delta"]["low"] <= body["delta"]["high"]


def test_diff_context_serves_unchanged_lines_from_the_candidates_tree(example_world, client_as) -> None:
    seed = seed_of(example_world)
    old = "".join(f"row {i}\n" for i in range(1, 61))
    parent = child(seed, {"ctx/file.py": old}, state=Candidate.State.ACCEPTED, certified_at=seed.certified_at)
    cand = child(parent, {"ctx/file.py": old.replace("row 30\n", "row thirty\n")})
    client = client_as("viewer")
    url = reverse("review:diff_context", args=[cand.pk])
    anchor = diffs.file_anchor("ctx/file.py")
    response = client.get(url, {"path": "ctx/file.py", "layout": "unified", "first": 5, "last": 7, "shift": 0})
    assert response.status_code == 200
    body = response.content.decode()
    assert [int(n) for n in re.findall(rf'id="{anchor}-R(\d+)"', body)] == [5, 6, 7]
    shown = re.sub(r"<[^>]+>", "", body)
    assert "row 6" in shown and "row 8" not in shown
    # The candidate's own tree: the parent's text of a changed line never comes back.
    changed = client.get(url, {"path": "ctx/file.py", "layout": "split", "first": 30, "last": 30, "shift": 0})
    shown = re.sub(r"<[^>]+>", "", changed.content.decode())
    assert "row thirty" in shown and "row 30" not in shown
    bad = [
        {"path": "ctx/file.py", "layout": "unified", "first": "x", "last": 7, "shift": 0},
        {"path": "ctx/file.py", "layout": "unified", "first": 9, "last": 7, "shift": 0},
        {"path": "ctx/file.py", "layout": "sideways", "first": 1, "last": 7, "shift": 0},
        {"path": "ctx/file.py", "layout": "unified", "first": 1, "last": 9000, "shift": 0},
    ]
    assert [client.get(url, query).status_code for query in bad] == [400, 400, 400, 400]
    missing = client.get(url, {"path": "nope.py", "layout": "unified", "first": 1, "last": 2, "shift": 0})
    assert missing.status_code == 404


def test_the_diff_page_keeps_the_chosen_comparison_in_its_links(example_world, client_as) -> None:
    seed = seed_of(example_world)
    parent = child(seed, {"cmp.txt": "a\n"}, state=Candidate.State.ACCEPTED, certified_at=seed.certified_at)
    cand = child(parent, {"cmp.txt": "b\n"})
    client = client_as("viewer")
    html = page(client.get(reverse("review:candidate_diff", args=[cand.pk]) + f"?against={seed.pk}&layout=unified"))
    assert f"#{seed.pk}" in html and "(its parent)" not in html
    assert f'<option value="{seed.pk}" selected>' in html
    assert f"?layout=split&amp;against={seed.pk}" in html
    here = reverse("review:candidate_diff", args=[cand.pk])
    assert f'name="next" value="{here}?against={seed.pk}&amp;layout=unified#' in html
