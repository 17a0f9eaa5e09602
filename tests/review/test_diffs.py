"""The diff model and its HTML: statuses, line numbers, highlighting,
intra-line and leak marks, layouts, collapsing. Pure: no database."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from evolution import digests
from evolution.trees import FileEntry
from review import diffs

XSS = "</script><img src=x onerror=alert(1)>{{ request }}"


def entry(path: str, data: str | bytes, mode: str = "100644") -> FileEntry:
    return FileEntry(path, mode, data.encode() if isinstance(data, str) else data)


def by_path(files: list[diffs.FileDiff]) -> dict[str, diffs.FileDiff]:
    return {fd.path: fd for fd in files}


def render(fd: diffs.FileDiff, old: str | None, new: str | None, layout: str = "unified", **kw) -> None:
    diffs.render_file(
        fd,
        layout=layout,
        old_data=old.encode() if old is not None else None,
        new_data=new.encode() if new else None,
        **kw,
    )


def unified_rows(fd: diffs.FileDiff) -> list[diffs.Row]:
    """The rows of a file rendered in the unified layout."""
    assert fd.rows is not None, "not rendered"
    rows = [row for row in fd.rows if isinstance(row, diffs.Row)]
    assert len(rows) == len(fd.rows), "not the unified layout"
    return rows


def split_rows(fd: diffs.FileDiff) -> list[diffs.SplitRow]:
    """The rows of a file rendered in the split layout."""
    assert fd.rows is not None, "not rendered"
    rows = [row for row in fd.rows if isinstance(row, diffs.SplitRow)]
    assert len(rows) == len(fd.rows), "not the split layout"
    return rows


def text_of(html: str) -> str:
    """What a browser shows: tags dropped, entities decoded."""
    plain = re.sub(r"<[^>]+>", "", html)
    return (
        plain.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", '"')
        .replace("&#x27;", "'")
        .replace("&amp;", "&")
    )


def test_statuses_counts_and_digests_of_every_kind_of_change() -> None:
    old = [
        entry("keep.txt", "a\nb\n"),
        entry("gone.md", "bye\n"),
        entry("dir/old name.txt", "same\n"),
        entry("run.sh", "echo\n"),
        entry("img.bin", b"\0\1\2"),
        entry("both.sh", "x\n"),
    ]
    new = [
        entry("keep.txt", "a\nc\nd\n"),
        entry("new.json", '{"a": 1}\n'),
        entry("dir/new name.txt", "same\n"),
        entry("run.sh", "echo\n", "100755"),
        entry("img.bin", b"\0\1\3"),
        entry("both.sh", "y\n", "100755"),
    ]
    files = by_path(diffs.build_file_diffs(old, new))
    assert set(files) == {"keep.txt", "gone.md", "dir/new name.txt", "run.sh", "img.bin", "both.sh", "new.json"}

    assert files["keep.txt"].status == "modified"
    assert (files["keep.txt"].added, files["keep.txt"].removed) == (2, 1)
    assert files["keep.txt"].old_digest == digests.blob_digest(b"a\nb\n")
    assert files["keep.txt"].new_digest == digests.blob_digest(b"a\nc\nd\n")

    assert files["gone.md"].status == "deleted" and files["gone.md"].new is None
    assert (files["gone.md"].added, files["gone.md"].removed) == (0, 1) and files["gone.md"].new_digest == ""
    assert files["new.json"].status == "added" and files["new.json"].old_digest == ""

    renamed = files["dir/new name.txt"]
    assert renamed.status == "renamed" and renamed.renamed_from == "dir/old name.txt"
    assert renamed.hunks == [] and renamed.changed == 0

    assert files["run.sh"].kinds == ["modified", "mode"] and files["run.sh"].mode_change == ("100644", "100755")
    assert files["run.sh"].hunks == [] and not files["run.sh"].content_changed
    assert files["both.sh"].kinds == ["modified", "mode"] and files["both.sh"].changed == 2
    assert files["img.bin"].kinds == ["modified", "binary"] and files["img.bin"].hunks == []

    anchors = [fd.anchor for fd in files.values()]
    assert len(set(anchors)) == len(anchors)
    assert files["keep.txt"].anchor == diffs.file_anchor("keep.txt")


def test_unified_rows_carry_line_numbers_of_both_sides() -> None:
    old = "one\ntwo\nthree\nfour\n"
    new = "one\nTWO\nthree\nfour\nfive\n"
    [fd] = diffs.build_file_diffs([entry("a.txt", old)], [entry("a.txt", new)])
    render(fd, old, new, "unified")
    rows = [(r.kind, r.old_no, r.new_no, text_of(r.html)) for r in unified_rows(fd)]
    assert rows == [
        ("hunk", None, None, "@@ -1,4 +1,5 @@"),
        ("ctx", 1, 1, "one"),
        ("del", 2, None, "two"),
        ("add", None, 2, "TWO"),
        ("ctx", 3, 3, "three"),
        ("ctx", 4, 4, "four"),
        ("add", None, 5, "five"),
    ]


def test_split_rows_pair_removals_with_additions_and_pad_the_rest() -> None:
    old = "a\nb\nc\nkeep\n"
    new = "A\nkeep\nnew1\nnew2\n"
    [fd] = diffs.build_file_diffs([entry("a.txt", old)], [entry("a.txt", new)])
    render(fd, old, new, "split")
    lines = [r for r in split_rows(fd) if r.kind == "line"]
    cells = [(r.left, r.right) for r in lines if r.left is not None and r.right is not None]
    assert len(cells) == len(lines)
    shape = [
        ((left.kind, left.no, text_of(left.html)), (right.kind, right.no, text_of(right.html))) for left, right in cells
    ]
    assert shape == [
        (("del", 1, "a"), ("add", 1, "A")),
        (("del", 2, "b"), ("empty", None, "")),
        (("del", 3, "c"), ("empty", None, "")),
        (("ctx", 4, "keep"), ("ctx", 2, "keep")),
        (("empty", None, ""), ("add", 3, "new1")),
        (("empty", None, ""), ("add", 4, "new2")),
    ]
    assert split_rows(fd)[0].kind == "hunk"


def test_intraline_marks_wrap_only_the_changed_words_of_paired_lines() -> None:
    old = 'history = "full"\n'
    new = 'history = "last"\n'
    [fd] = diffs.build_file_diffs([entry("w.txt", old)], [entry("w.txt", new)])
    render(fd, old, new, "unified")
    removed = next(r for r in unified_rows(fd) if r.kind == "del")
    added = next(r for r in unified_rows(fd) if r.kind == "add")
    assert str(removed.html) == 'history = &quot;<span class="x">full</span>&quot;'
    assert str(added.html) == 'history = &quot;<span class="x">last</span>&quot;'


def test_unrelated_lines_get_no_intraline_marks() -> None:
    assert diffs.intraline_spans("completely different words here", "x = 42") == ([], [])
    assert diffs.intraline_spans("temperature = 0.9", "temperature = 0.2") == ([(16, 17)], [(16, 17)])


def test_last_line_without_newline_pairs_and_shows_the_marker() -> None:
    old = "a\nlast = 1"
    new = "a\nlast = 2"
    [fd] = diffs.build_file_diffs([entry("n.txt", old)], [entry("n.txt", new)])
    render(fd, old, new, "unified")
    rows = unified_rows(fd)
    kinds = [r.kind for r in rows]
    assert kinds == ["hunk", "ctx", "del", "eof", "add", "eof"]
    assert '<span class="x">1</span>' in str(rows[2].html)
    assert '<span class="x">2</span>' in str(rows[4].html)
    assert text_of(rows[3].html) == "No newline at end of file"


def _highlighted(path: str, old: str, new: str) -> str:
    [fd] = diffs.build_file_diffs([entry(path, old)], [entry(path, new)])
    render(fd, old, new, "unified")
    return "".join(str(r.html) for r in unified_rows(fd) if r.kind == "add")


def test_pygments_classes_by_file_type() -> None:
    py = _highlighted("tool.py", "x = 1\n", "def run(x):\n    return 'done'\n")
    assert '<span class="k">def</span>' in py and '<span class="nf">run</span>' in py
    assert '<span class="k">return</span>' in py

    js = _highlighted("data.json", "{}\n", '{"name": 1}\n')
    assert '<span class="nt">&quot;name&quot;</span>' in js and '<span class="mi">1</span>' in js

    md = _highlighted("notes.md", "x\n", "# Title\n\nsome *text*\n")
    assert '<span class="gh"># Title</span>' in md and '<span class="ge">*text*</span>' in md

    yml = _highlighted("config.yaml", "a: 1\n", "key: value\n")
    assert '<span class="nt">key</span>' in yml

    plain = _highlighted("README.unknownext", "a\n", "def x\n")
    assert "<span" not in plain and plain == "def x"


def test_multiline_tokens_keep_their_colour_on_every_line() -> None:
    old = "x = 1\n"
    new = 'x = 1\ndoc = """first\nsecond line\n"""\n'
    html = _highlighted("m.py", old, new)
    assert '<span class="s2">second line</span>' in html


def test_untrusted_content_is_escaped_in_every_layout() -> None:
    old = "safe\n"
    new = f"safe\n{XSS}\n"
    for layout in diffs.LAYOUTS:
        for path in ("page.html", "x.py", "plain.txt"):
            [fd] = diffs.build_file_diffs([entry(path, old)], [entry(path, new)])
            render(fd, old, new, layout)
            if layout == "unified":
                html = "".join(str(r.html) for r in unified_rows(fd))
            else:
                html = "".join(str(r.html) + str(getattr(r.right, "html", "")) for r in split_rows(fd))
            assert "<img" not in html and "</script>" not in html and "<script" not in html
            assert "&lt;/script&gt;" in html or "&lt;" in html
            assert XSS in text_of(html)


def test_leak_marks_wrap_escaped_text_on_the_new_side_only() -> None:
    old = 'prompt = "<b>route-017</b>"\n'
    new = 'prompt = "<b>route-017</b> and route-017"\n'
    marks = [diffs.LeakMark("p.txt", "<b>route-017</b>", 'rule task_id; "quoted" <evidence>')]
    [fd] = diffs.build_file_diffs([entry("p.txt", old)], [entry("p.txt", new)])
    render(fd, old, new, "unified", marks=marks)
    added = str(next(r for r in unified_rows(fd) if r.kind == "add").html)
    removed = str(next(r for r in unified_rows(fd) if r.kind == "del").html)
    title = 'title="rule task_id; &quot;quoted&quot; &lt;evidence&gt;"'
    assert f'<mark class="leak" {title}>&lt;b&gt;route-017&lt;/b&gt;</mark>' in added
    assert added.count("<mark") == 1  # the bare "route-017" is a different text
    assert "<mark" not in removed
    assert "<b>" not in added


def test_leak_marks_inside_highlighted_tokens_keep_tags_balanced() -> None:
    line = 'x = "see task-17 now"'
    segments = [("n", "x"), ("", " "), ("o", "="), ("", " "), ("s2", '"see task-17 now"')]
    html = str(diffs.line_html(segments, changes=[(4, 12)], leaks=[(9, 16, "rule")]))
    assert text_of(html) == line
    # Tags open and close in strict nesting order.
    stack: list[str] = []
    for match in re.finditer(r"<(/?)(span|mark)\b", html):
        closing, name = match.groups()
        if closing:
            assert stack and stack.pop() == name
        else:
            stack.append(name)
    assert stack == []
    assert '<mark class="leak" title="rule">' in html


def test_carriage_returns_are_shown_not_dropped_and_highlighting_stays_aligned() -> None:
    old = "a = 1\r\nb = 2\r\n"
    new = "a = 1\r\nb = 3\r\n"
    [fd] = diffs.build_file_diffs([entry("c.py", old)], [entry("c.py", new)])
    render(fd, old, new, "unified")
    added = next(r for r in unified_rows(fd) if r.kind == "add")
    assert text_of(added.html) == "b = 3" + diffs.CR_SYMBOL
    assert '<span class="n">b</span>' in str(added.html)


def _file(changed_pairs: int) -> diffs.FileDiff:
    old = "".join(f"old {i}\n" for i in range(changed_pairs))
    new = "".join(f"new {i}\n" for i in range(changed_pairs))
    [fd] = diffs.build_file_diffs([entry("f.txt", old)], [entry("f.txt", new)])
    return fd


def test_plan_collapse_hides_large_files_and_keeps_the_page_within_its_budget() -> None:
    small, large, medium, tiny = _file(10), _file(300), _file(150), _file(2)
    files = [small, large, medium, tiny]
    diffs.plan_collapse(files, collapse_lines=400, budget=325)
    assert small.collapsed is None  # 21 lines rendered
    assert large.collapsed == "large"  # 600 changed lines > 400, costs nothing
    assert medium.collapsed is None  # 21 + 301 = 322 lines
    assert tiny.collapsed == "budget"  # 322 + 5 > 325
    diffs.plan_collapse(files, collapse_lines=400, budget=330)
    assert tiny.collapsed is None  # 327 lines fit


def test_plan_collapse_budget() -> None:
    files = [_file(100) for _ in range(5)]  # 201 lines each
    diffs.plan_collapse(files, collapse_lines=400, budget=500)
    assert [f.collapsed for f in files] == [None, None, "budget", "budget", "budget"]
    rendered = sum(f.line_count for f in files if f.collapsed is None)
    assert rendered <= 500
    assert files[2].changed_display == "200"
    assert _file(700).changed_display == "1,400"


def test_listing_without_diffing_agrees_with_the_diff_on_every_kind_of_change() -> None:
    old = [
        entry("keep.txt", "a\nb\n"),
        entry("gone.md", "bye\n"),
        entry("dir/old name.txt", "same\n"),
        entry("run.sh", "echo\n"),
        entry("img.bin", b"\0\1\2"),
        entry("latin.txt", "caf\xe9\n".encode("latin-1")),
        entry("empty.txt", ""),
        entry("link", "target", "120000"),
        entry("moved.txt", "x\ny\nz\n"),
    ]
    new = [
        entry("keep.txt", "a\nc\nd\n"),
        entry("new.json", '{"a": 1}\n'),
        entry("dir/new name.txt", "same\n"),
        entry("run.sh", "echo\n", "100755"),
        entry("img.bin", b"\0\1\3"),
        entry("latin.txt", b"cafe\n"),
        entry("blank.txt", ""),
        entry("link", "target\n"),
        entry("moved.txt", "z\nx\ny"),
    ]
    listed = diffs.list_file_diffs(old, new)
    built = diffs.build_file_diffs(old, new)
    assert [(f.path, f.status, f.binary, f.anchor) for f in listed] == [
        (f.path, f.status, f.binary, f.anchor) for f in built
    ]
    for fd, exact in zip(listed, built, strict=True):
        if fd.counted:  # known without a diff: it has no hunks
            assert (fd.added, fd.removed, exact.hunks) == (0, 0, []), fd.path
        else:
            assert exact.hunks and exact.changed is not None and 1 <= fd.least_changed <= exact.changed, fd.path
    uncounted = {fd.path for fd in listed if not fd.counted}
    assert uncounted == {"keep.txt", "gone.md", "new.json", "link", "moved.txt"}
    diffs.count_file_diffs(listed, old, new)
    assert [(f.added, f.removed, f.hunks) for f in listed] == [(f.added, f.removed, f.hunks) for f in built]


def test_least_changed_is_a_lower_bound_that_counts_unpaired_lines() -> None:
    assert diffs.least_changed(b"a\nb\n", b"a\nb\n") == 0
    assert diffs.least_changed(b"a\nb\n", b"b\na\n") == 1  # a permutation: some change, none unpaired
    assert diffs.least_changed(b"a\nb\nc\n", b"a\nB\nc\nd\n") == 3  # b removed, B and d added
    assert diffs.least_changed(b"a\nb\n", b"a\nb") == 2  # the last line lost its newline
    old, new = "".join(f"old {i}\n" for i in range(300)), "".join(f"new {i}\n" for i in range(300))
    assert diffs.least_changed(old.encode(), new.encode()) == 600


def _stubs(*pairs: int) -> tuple[list[diffs.FileDiff], list[FileEntry], list[FileEntry]]:
    """Files of ``pairs[n]`` lines, every line changed; a negative number
    gives a file of 20 lines with one change in the middle (9 diff lines,
    of which only 2 are changed)."""
    old: list[FileEntry] = []
    new: list[FileEntry] = []
    for n, p in enumerate(pairs):
        if p < 0:
            lines = [f"line {i}\n" for i in range(20)]
            old.append(entry(f"f{n}.txt", "".join(lines)))
            new.append(entry(f"f{n}.txt", "".join(lines[:10] + ["changed\n"] + lines[11:])))
        else:
            old.append(entry(f"f{n}.txt", "".join(f"old {i}\n" for i in range(p))))
            new.append(entry(f"f{n}.txt", "".join(f"new {i}\n" for i in range(p))))
    return diffs.list_file_diffs(old, new), old, new


def _recording_count(old: list, new: list) -> tuple[list[str], Callable[[diffs.FileDiff], None]]:
    """A ``count`` for plan_collapse that diffs the file and records its path."""
    diffed: list[str] = []

    def count(fd: diffs.FileDiff) -> None:
        diffed.append(fd.path)
        diffs.count_file_diffs([fd], old, new)

    return diffed, count


def test_plan_collapse_diffs_only_the_files_it_may_render() -> None:
    files, old, new = _stubs(10, 300, 150, 2, 100, 1)
    diffed, count = _recording_count(old, new)
    diffs.plan_collapse(files, count=count, collapse_lines=400, budget=325)
    # f1 has 600 unpaired lines: large. f3 (at least 5 lines) and f4 (201) cannot fit in the 3 lines
    # left after f0 and f2 (21 + 301): neither is diffed. f5 (3 lines) still fits.
    assert diffed == ["f0.txt", "f2.txt", "f5.txt"]
    assert [f.collapsed for f in files] == [None, "large", None, "budget", "budget", None]
    assert [f.counted for f in files] == [True, False, True, False, False, True]
    assert sum(f.line_count for f in files if f.collapsed is None) == 325
    with pytest.raises(ValueError, match="no count"):
        diffs.plan_collapse(_stubs(1)[0])


def test_plan_collapse_stops_diffing_after_a_file_diffed_in_vain() -> None:
    files, old, new = _stubs(10, 150, -1, 1)
    diffed, count = _recording_count(old, new)
    diffs.plan_collapse(files, count=count, collapse_lines=400, budget=327)
    # f2 may fit (at least 3 lines) but takes 9: diffed in vain, so the page counts as full and
    # f3 (3 lines) waits undiffed, though it would have fit.
    assert diffed == ["f0.txt", "f1.txt", "f2.txt"]
    assert [f.collapsed for f in files] == [None, None, "budget", "budget"]
    assert (files[2].line_count, files[2].changed, files[3].counted) == (9, 2, False)


def test_plan_collapse_of_a_diff_of_many_files_diffs_a_bounded_number() -> None:
    files, old, new = _stubs(*([100] * 200))
    diffed, count = _recording_count(old, new)
    diffs.plan_collapse(files, count=count, collapse_lines=400, budget=500)
    # Two files of 201 lines fit; the third is at least 201 lines: none is diffed after them.
    assert diffed == ["f0.txt", "f1.txt"]
    assert [f.collapsed for f in files[:3]] == [None, None, "budget"] and files[-1].collapsed == "budget"


# --- Hidden context, permalinks and the file tree ------------------------------------


def numbered(count: int, changed: dict[int, str] | None = None) -> str:
    changed = changed or {}
    return "".join(changed.get(i, f"line {i}") + "\n" for i in range(1, count + 1))


def test_hidden_gaps_cover_every_unchanged_line_outside_the_hunks() -> None:
    # Line 30 changed and 10 lines inserted after line 60: two hunks with 3 context lines each.
    old = numbered(100, {30: "old 30"})
    new_lines = [f"line {i}" for i in range(1, 101)]
    new_lines[29] = "new 30"
    new_lines[60:60] = [f"inserted {i}" for i in range(10)]
    new = "".join(line + "\n" for line in new_lines)
    [fd] = diffs.build_file_diffs([entry("a.txt", old)], [entry("a.txt", new)])
    assert [(h.new_start, h.new_count) for h in fd.hunks] == [(27, 7), (58, 16)]
    gaps = diffs.hidden_gaps(fd.hunks, diffs.line_total(new.encode()))
    assert gaps == [
        diffs.Gap(first=1, count=26, shift=0),
        diffs.Gap(first=34, count=24, shift=0),
        diffs.Gap(first=74, count=37, shift=-10, tail=True),
    ]
    shown = {line.new_no for hunk in fd.hunks for line in hunk.lines if line.new_no}
    hidden = {n for gap in gaps if gap for n in range(gap.first, gap.last + 1)}
    assert shown.isdisjoint(hidden) and shown | hidden == set(range(1, 111))
    # A file whose change reaches its last line has nothing below it.
    [end] = diffs.build_file_diffs([entry("b.txt", numbered(5))], [entry("b.txt", numbered(5, {5: "last"}))])
    assert diffs.hidden_gaps(end.hunks, 5) == [diffs.Gap(first=1, count=1, shift=0), None]


def test_context_rows_number_both_sides_link_each_line_and_escape_it() -> None:
    new = numbered(40, {12: XSS}).encode()
    anchor = diffs.file_anchor("p.py")
    html = diffs.context_rows(new_data=new, path="p.py", layout="unified", first=11, last=13, shift=-2, anchor=anchor)
    assert html.count("<tr") == 3
    assert f'<td class="no" id="{anchor}-L9"><a href="#{anchor}-L9">9</a></td>' in html
    assert f'<td class="no" id="{anchor}-R11"><a href="#{anchor}-R11">11</a></td>' in html
    assert "<img" not in html and text_of(html).count(XSS) == 1
    split = diffs.context_rows(new_data=new, path="p.py", layout="split", first=39, last=45, shift=0, anchor=anchor)
    # Lines past the end of the file are left out; both sides show each line.
    assert split.count("<tr") == 2 and f'id="{anchor}-L40"' in split and f'id="{anchor}-R40"' in split


def test_rendered_hunks_carry_expand_buttons_for_their_hidden_lines() -> None:
    old = numbered(80)
    new = numbered(80, {40: "changed"})
    [fd] = diffs.build_file_diffs([entry("a.txt", old)], [entry("a.txt", new)])
    render(fd, old, new)
    html = str(fd.body_html)
    assert 'data-first="1" data-count="36" data-shift="0"' in html  # above the change
    assert "36 unchanged lines above" in html and "37 unchanged lines below" in html
    assert html.count('class="expand expand-all"') == 2 and html.count('class="expand expand-up"') == 1
    assert f'id="{fd.anchor}-R40"' in html


def test_the_file_tree_nests_folders_first_and_joins_single_folders() -> None:
    files = diffs.build_file_diffs(
        [], [entry(p, "x\n") for p in ("README.md", "src/pkg/b.py", "src/pkg/a.py", "src/tests/t.py", "z.txt")]
    )
    tree = [(node.depth, node.name, node.file.path if node.file else None) for node in diffs.file_tree(files)]
    assert tree == [
        (0, "src", None),
        (1, "pkg", None),
        (2, "a.py", "src/pkg/a.py"),
        (2, "b.py", "src/pkg/b.py"),
        (1, "tests", None),
        (2, "t.py", "src/tests/t.py"),
        (0, "README.md", "README.md"),
        (0, "z.txt", "z.txt"),
    ]
    deep = diffs.build_file_diffs([], [entry("a/b/c/d.py", "x\n"), entry("e.py", "y\n")])
    assert [(n.depth, n.name) for n in diffs.file_tree(deep)] == [(0, "a/b/c"), (1, "d.py"), (0, "e.py")]


def test_a_binary_file_says_what_makes_it_binary_and_is_checked_for_hidden_characters() -> None:
    old = [entry("memory/notes.md", "notes\n")]
    new = [entry("memory/notes.md", "notes\n/*\u202e } */\n".encode() + b"#\xff\xfe\x00\n")]
    (fd,) = diffs.list_file_diffs(old, new)
    assert fd.binary and fd.kinds == ["modified", "binary"]
    assert fd.not_text == "the file holds 1 NUL byte and 2 bytes that are not UTF-8"
    assert fd.hidden_old is None and fd.hidden_new is not None
    assert fd.hidden_banners == [
        "This file contains bidirectional Unicode text that may be interpreted or compiled differently than what "
        "appears below. 4 characters: 1 × U+202E (bidi), 1 × 0xFF (not UTF-8), 1 × 0xFE (not UTF-8), "
        "1 × U+0000 (control). Each is shown as a marker such as <U+202E>; hover a marker for its name."
    ]
    (gone,) = diffs.list_file_diffs(new, [])
    assert gone.not_text == "the deleted file held 1 NUL byte and 2 bytes that are not UTF-8"
