"""The diff (screen 4): a candidate against its parent or another candidate of its experiment, split or unified,
with the leakage flags marked in it. The files are diffed through the pure ``review.diffs``; rendered files and
parsed diffs are cached by content. Reads only (the cache aside)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache
from django.http import Http404
from django.urls import reverse
from django.utils.http import urlencode

from evolution.models import Candidate, Experiment
from evolution.services.snapshots import tree_entries
from evolution.trees import FileEntry
from review import diffs
from review.models import ViewedFile
from review.pages import Page
from review.pages.candidate import Choice, ShownFlag, candidate_choices, flag_title, shown_flags

DIFF_CACHE_SECONDS = 3600
# Bump when the rendered rows change shape, so stale cache entries are ignored.
DIFF_CACHE_VERSION = 4


@dataclass(frozen=True)
class DiffRequest:
    """What the view parsed: the candidate, what it is compared with and the layout."""

    candidate: Candidate
    against: Candidate | None  # None: the empty tree (the seed has no parent)
    layout: str
    against_is_parent: bool


def leak_marks(cand: Candidate, user: Any) -> tuple[list[ShownFlag], dict[str, list[diffs.LeakMark]]]:
    flags = shown_flags(candidate=cand, user=user)
    marks: dict[str, list[diffs.LeakMark]] = {}
    for flag in flags:
        if flag.path and flag.shown_matched:
            marks.setdefault(flag.path, []).append(diffs.LeakMark(flag.path, flag.shown_matched, flag_title(flag)))
    return flags, marks


def render_cached(
    fd: diffs.FileDiff, layout: str, old: dict[str, FileEntry], new: dict[str, FileEntry], marks: list[diffs.LeakMark]
) -> None:
    """Render one file, reusing the rows of an identical earlier rendering:
    the key holds both blob digests, both paths (the lexer), the layout and
    the leak marks, so a changed file can never get stale rows."""
    mark_key = hashlib.sha256(
        json.dumps([[m.matched, m.title] for m in marks], ensure_ascii=False).encode()
    ).hexdigest()[:16]
    raw_key = "|".join(
        (fd.old_digest, fd.new_digest, fd.old_path or "", fd.path, layout, mark_key, str(DIFF_CACHE_VERSION))
    )
    key = "review-diff:" + hashlib.sha256(raw_key.encode("utf-8", "surrogateescape")).hexdigest()
    hit = cache.get(key)
    if hit is not None:
        fd.rows, fd.language, fd.body_html = hit
        return
    old_entry = old.get(fd.old_path) if fd.old_path is not None else None
    new_entry = new.get(fd.path) if fd.new is not None else None
    diffs.render_file(
        fd,
        layout=layout,
        old_data=old_entry.data if old_entry else None,
        new_data=new_entry.data if new_entry else None,
        marks=marks,
    )
    cache.set(key, (fd.rows, fd.language, fd.body_html), DIFF_CACHE_SECONDS)


class ParseMemo:
    """Parsed file diffs in the cache, keyed by content (``diffs.ParsedMemo``)."""

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        return cache.get_many(keys)

    def set_many(self, data: dict[str, Any]) -> None:
        cache.set_many(data, DIFF_CACHE_SECONDS)


def diff_entries(req: DiffRequest) -> tuple[list[FileEntry], list[FileEntry]]:
    """The two trees of the diff: the base (empty for a seed) and the candidate."""
    old_entries = tree_entries(tree=req.against.tree) if req.against is not None else []
    return old_entries, tree_entries(tree=req.candidate.tree)


def planned_files(old_entries: list[FileEntry], new_entries: list[FileEntry]) -> list[diffs.FileDiff]:
    """The files of the whole diff, collapsed as planned: only the files the
    plan may render are diffed (through the cache), the others wait for the
    counts request. The same plan on every request for the same trees."""
    files = diffs.list_file_diffs(old_entries, new_entries)
    memo = ParseMemo()

    def count(fd: diffs.FileDiff) -> None:
        diffs.count_file_diffs([fd], old_entries, new_entries, memo=memo)

    diffs.plan_collapse(files, count=count)
    return files


def _diff_files(
    user: Any, req: DiffRequest, *, only_path: str | None = None, count_all: bool = False
) -> tuple[list[diffs.FileDiff], list[ShownFlag]]:
    """The files of the diff, collapsed as planned and rendered where not;
    with ``count_all``, the collapsed files are counted too."""
    old_entries, new_entries = diff_entries(req)
    if only_path is not None:
        files = diffs.build_file_diffs(old_entries, new_entries, only_path=only_path, memo=ParseMemo())
        files = [fd for fd in files if only_path in (fd.path, fd.old_path)]
        if not files:
            raise Http404("this file is not part of the diff")
    else:
        files = planned_files(old_entries, new_entries)
        if count_all:
            diffs.count_file_diffs(files, old_entries, new_entries, memo=ParseMemo())
    viewed = set(
        ViewedFile.objects.filter(user=user, path__in=[fd.path for fd in files]).values_list(
            "path", "old_digest", "new_digest"
        )
    )
    flags, marks = leak_marks(req.candidate, user)
    old_map = {entry.path: entry for entry in old_entries}
    new_map = {entry.path: entry for entry in new_entries}
    for fd in files:
        fd.viewed = (fd.path, fd.old_digest, fd.new_digest) in viewed
        if fd.collapsed is None and fd.hunks:
            render_cached(fd, req.layout, old_map, new_map, marks.get(fd.path, []) if fd.new else [])
    return files, flags


@dataclass(frozen=True)
class DiffPage(Page):
    candidate: Candidate
    experiment: Experiment
    against: Candidate | None
    against_is_parent: bool
    layout: str
    layouts: tuple[str, ...]
    files: list[diffs.FileDiff]
    tree: Any  # diffs.file_tree
    summary: diffs.DiffSummary
    flags: list[ShownFlag]
    marked_flags: int  # flags whose matched text is marked in the diff
    collapse_lines: int
    page_budget: int
    against_param: str  # "" : the parent
    counts_url: str
    here: str  # the request's path and query, where a "viewed" mark returns
    choices: list[Choice] | None = None  # the "compare with" select, on a whole page only
    late: list[diffs.FileDiff] | None = None  # the files counted by a counts request
    single: bool = False  # one file of the diff, shown alone


def _page(req: DiffRequest, files: list[diffs.FileDiff], flags: list[ShownFlag], *, here: str, **rest: Any) -> DiffPage:
    cand = req.candidate
    query = {"layout": req.layout}
    if req.against is not None and not req.against_is_parent:
        query["against"] = str(req.against.pk)
    counts_url = reverse("review:candidate_diff", args=[cand.pk]) + "?" + urlencode({**query, "counts": "1"})
    return DiffPage(
        candidate=cand,
        experiment=cand.experiment,
        against=req.against,
        against_is_parent=req.against_is_parent,
        layout=req.layout,
        layouts=diffs.LAYOUTS,
        files=files,
        tree=diffs.file_tree(files),
        summary=diffs.DiffSummary(files),
        flags=flags,
        marked_flags=sum(1 for flag in flags if flag.path and flag.shown_matched),
        collapse_lines=diffs.COLLAPSE_LINES,
        page_budget=diffs.PAGE_BUDGET,
        against_param=query.get("against", ""),
        counts_url=counts_url,
        here=here,
        **rest,
    )


def diff_page(
    *,
    user: Any,
    req: DiffRequest,
    here: str,
    only_path: str | None = None,
    count_all: bool = False,
    choices: bool = False,
    single: bool = False,
) -> DiffPage:
    """The diff as ``user`` sees it (viewed marks, leak marks): the files collapsed as planned and rendered
    where not, or only the file at ``only_path`` in full (404 when it is not part of the diff); with
    ``count_all`` the collapsed files are counted too, with ``choices`` the "compare with" select is filled."""
    files, flags = _diff_files(user, req, only_path=only_path, count_all=count_all)
    listed = candidate_choices(req.candidate, also=req.against) if choices else None
    return _page(req, files, flags, here=here, choices=listed, single=single)


def diff_counts_page(*, req: DiffRequest, here: str) -> DiffPage:
    """Only the line counts of the files the planned diff collapsed (``late``), what the page asks for once
    loaded."""
    old_entries, new_entries = diff_entries(req)
    files = planned_files(old_entries, new_entries)
    late = [fd for fd in files if not fd.counted]
    diffs.count_file_diffs(late, old_entries, new_entries, memo=ParseMemo())
    return _page(req, files, [], here=here, late=late)
