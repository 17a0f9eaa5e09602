"""Benchmark ``diff-render``: the side-by-side diff page against pygments alone.

Two real stored trees of mixed languages (``files`` files, ``lines_per_file``
changed lines each: 20,000 over 50 files by default) become a seed and a
proposed candidate. Measured through the real views with a signed-in viewer:

- the first response of the candidate diff page (what the page shows first);
- the full render: that response, the request for the collapsed files'
  line counts the page sends once loaded, and every "Load diff" partial
  the page's htmx links fetch for the files it left collapsed;
- the floor: pygments highlighting the same old-side and new-side lines of
  every file to HTML, nothing else.

Target: full render <= 2x the floor. The first response must be bounded by
the collapse threshold, not by the diff size: it is also measured on a diff
of ``small_files`` files of the same per-file size, and its time may grow by
at most ``FIRST_RESPONSE_GROWTH`` and its bytes by at most that factor too.
Every measured visit starts with an empty cache (a first visit: nothing was
rendered before it); within the visit, the partials may reuse what the first
response computed, as they do for a real reader. Ratios are of CPU time of
this process (the test client runs the views in it), since the machines are
shared; wall times are printed beside them.
"""

from __future__ import annotations

import html
import re
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from pygments import highlight
from pygments.formatters import HtmlFormatter

from evolution.services.snapshots import tree_store
from evolution.trees import FileEntry
from lab.bench import BenchResult, benchmark, stopwatch
from lab.bench.scratch import bench_experiment, child_candidate, client_for, maybe_scratch, served_hosts
from review import diffs

TARGET = 2.0
FIRST_RESPONSE_GROWTH = 1.5

# One changed line per template per version; ``{i}`` the line, ``{v}`` a value that changes.
TEMPLATES: dict[str, tuple[str, str, str]] = {
    # extension: (first line, line template, last line)
    "py": ("import math\n", "def handler_{i}(value): return math.floor(value * {v}) + len('item {i}')  # {i}", ""),
    "js": ("'use strict';\n", "export function handler{i}(value) {{ return value * {v}; }} // step {i}", ""),
    "ts": ("type N = number;\n", "export const handler{i} = (value: N): N => value * {v}; /* step {i} */", ""),
    "go": ("package bench\n", "func handler{i}(value int) int {{ return value * {v} }} // step {i}", ""),
    "rs": ("#![allow(dead_code)]\n", "fn handler_{i}(value: i64) -> i64 {{ value * {v} }} // step {i}", ""),
    "c": ("#include <stdio.h>\n", 'static int handler_{i}(int value) {{ printf("{i}"); return value * {v}; }}', ""),
    "yaml": ("items:\n", '  key_{i}: {{name: "item {i}", weight: {v}, enabled: true}}', ""),
    "md": ("# Steps\n", "- Step {i}: multiply the value by **{v}** and check `handler_{i}`.", ""),
    "toml": ("[items]\n", 'key_{i} = {{ name = "item {i}", weight = {v} }}', ""),
    "json": ("{\n", '  "key_{i}": {{"name": "item {i}", "weight": {v}}},', '  "end": 0\n}\n'),
}


def _file_text(extension: str, lines: int, version: int) -> str:
    """``lines`` body lines; in version 1 two of every three change their
    value, so the file's diff is one hunk of that many -/+ pairs."""
    first, template, last = TEMPLATES[extension]
    body = []
    for i in range(lines):
        value = i * 7 + (version if i % 3 != 2 else 0)
        body.append(template.format(i=i, v=value) + "\n")
    return first + "".join(body) + last


def make_trees(files: int, lines_per_file: int) -> tuple[list[FileEntry], list[FileEntry]]:
    """Old and new entries: ``files`` files cycling through the languages,
    each with ``lines_per_file`` changed lines (half removed, half added)."""
    extensions = list(TEMPLATES)
    old: list[FileEntry] = []
    new: list[FileEntry] = []
    for number in range(files):
        extension = extensions[number % len(extensions)]
        # Two of every three lines change; each change is a removed and an added line.
        body = max(3, round(lines_per_file * 3 / 4))
        path = f"src/{extension}/module_{number:03d}.{extension}"
        old.append(FileEntry(path, "100644", _file_text(extension, body, 0).encode()))
        new.append(FileEntry(path, "100644", _file_text(extension, body, 1).encode()))
    return old, new


@dataclass(frozen=True)
class Took:
    """Elapsed wall time and this process's CPU time, in seconds. The test
    client runs the view in this process, so CPU time is the server's work
    without the waits a shared, loaded machine adds."""

    wall: float
    cpu: float

    def __add__(self, other: Took) -> Took:
        return Took(self.wall + other.wall, self.cpu + other.cpu)


@contextmanager
def clock() -> Iterator[list[Took]]:
    took = [Took(0.0, 0.0)]
    cpu = time.process_time()
    with stopwatch() as wall:
        yield took
    took[0] = Took(wall[0], time.process_time() - cpu)


@dataclass
class PageTimes:
    first: Took
    first_bytes: int
    full: Took
    partials: int
    counts: int  # requests for the collapsed files' counts (0 or 1)


@dataclass(frozen=True)
class DiffSize:
    files: int
    changed: int


def diff_size(old: list[FileEntry], new: list[FileEntry]) -> DiffSize:
    found = diffs.build_file_diffs(old, new)
    # build_file_diffs diffs every file, so each one's count is known.
    return DiffSize(files=len(found), changed=sum(fd.changed or 0 for fd in found))


LOAD_RE = re.compile(r'hx-get="([^"]*/diff/file/[^"]*)"')
COUNTS_RE = re.compile(r'hx-get="([^"]*[?&;]counts=1[^"]*)" hx-trigger="load"')


def _measure_page(client: Client, candidate_pk: int) -> PageTimes:
    """A first visit: the cache is cleared once, then the page, the counts
    request it sends once loaded and every "Load diff" partial its htmx
    links fetch, one after the other."""
    cache.clear()
    url = reverse("review:candidate_diff", args=[candidate_pk])
    with clock() as first:
        response = client.get(url)
    if response.status_code != 200:
        raise RuntimeError(f"GET {url} answered {response.status_code}")
    content = response.content.decode()
    loads = sorted(set(LOAD_RE.findall(content)))
    counts = sorted(set(COUNTS_RE.findall(content)))
    total = first[0]
    for link in counts:
        with clock() as one:
            answer = client.get(html.unescape(link), headers={"HX-Request": "true"})
        if answer.status_code != 200 or b'id="diff-totals"' not in answer.content:
            raise RuntimeError(f"GET {link} answered {answer.status_code} without the totals")
        total += one[0]
    for link in loads:
        with clock() as one:
            partial = client.get(html.unescape(link), headers={"HX-Request": "true"})
        if partial.status_code != 200 or b"<table" not in partial.content:
            raise RuntimeError(f"GET {link} answered {partial.status_code} without the file's rows")
        total += one[0]
    return PageTimes(
        first=first[0], first_bytes=len(response.content), full=total, partials=len(loads), counts=len(counts)
    )


def _floor_inputs(old: list[FileEntry], new: list[FileEntry]) -> list[tuple[str, str]]:
    """Per file, the old-side and the new-side lines the diff shows
    (context, removed and added lines), as two texts."""
    sides: list[tuple[str, str]] = []
    for fd in diffs.build_file_diffs(old, new):
        left = [line.text for hunk in fd.hunks for line in hunk.lines if line.kind in (" ", "-")]
        right = [line.text for hunk in fd.hunks for line in hunk.lines if line.kind in (" ", "+")]
        sides += [(fd.path, "\n".join(left) + "\n"), (fd.path, "\n".join(right) + "\n")]
    return sides


def _pygments_floor(sides: list[tuple[str, str]]) -> Took:
    """pygments highlighting those lines to HTML, and nothing else."""
    formatter = HtmlFormatter(nowrap=True)
    with clock() as took:
        for path, text in sides:
            highlight(text, diffs.lexer_for(path), formatter)
    return took[0]


def _median(values: list[Took]) -> Took:
    return Took(statistics.median(t.wall for t in values), statistics.median(t.cpu for t in values))


def _ms(took: Took) -> str:
    return f"{took.cpu * 1000:.0f} ms CPU ({took.wall * 1000:.0f} ms wall)"


@benchmark(
    "diff-render",
    "side-by-side diff page (first response and every file) vs pygments alone",
    quick={"files": 12, "lines_per_file": 400, "small_files": 5, "repeat": 1},
    own_database=True,
)
def run(
    *, files: int = 50, lines_per_file: int = 400, small_files: int = 5, repeat: int = 3, scratch: bool = True
) -> BenchResult:
    old, new = make_trees(files, lines_per_file)
    old_small, new_small = make_trees(small_files, lines_per_file)
    size = diff_size(old, new)
    sides = _floor_inputs(old, new)
    with maybe_scratch(scratch), served_hosts():
        big = bench_experiment(name="bench-diff-big", seed_tree=tree_store(entries=old))
        big_child = child_candidate(big, tree_store(entries=new), label="bench diff")
        small = bench_experiment(name="bench-diff-small", seed_tree=tree_store(entries=old_small))
        small_child = child_candidate(small, tree_store(entries=new_small), label="bench diff small")
        client = client_for("viewer", username="bench-diff-viewer")
        # Warm-up (imports every lexer and the templates), not measured.
        _pygments_floor(sides)
        _measure_page(client, small_child.pk)
        floors, bigs, smalls = [], [], []
        # Interleaved, so a burst of load on the shared machine hits both sides.
        for _ in range(repeat):
            floors.append(_pygments_floor(sides))
            bigs.append(_measure_page(client, big_child.pk))
            smalls.append(_measure_page(client, small_child.pk))
    floor = _median(floors)
    full = _median([b.full for b in bigs])
    first = _median([b.first for b in bigs])
    first_small = _median([s.first for s in smalls])
    ratio = full.cpu / floor.cpu
    first_growth = first.cpu / first_small.cpu
    bytes_growth = bigs[0].first_bytes / smalls[0].first_bytes
    partials = bigs[0].partials
    floor_lines = sum(text.count("\n") for _, text in sides)
    lines = [
        f"diff: {size.files} files, {size.changed:,} changed lines; the floor highlights {floor_lines:,} lines",
        f"pygments only (floor): {_ms(floor)}",
        f"first response ({size.files - partials} files rendered, {partials} collapsed): {_ms(first)}, "
        f"{bigs[0].first_bytes:,} bytes",
        f"full render (first response + {bigs[0].counts} counts request + {partials} file partials): {_ms(full)}",
        f"first response with {small_files} files of the same size: {_ms(first_small)}, "
        f"{smalls[0].first_bytes:,} bytes (growth x{first_growth:.2f} CPU time, x{bytes_growth:.2f} bytes; "
        f"allowed x{FIRST_RESPONSE_GROWTH:g})",
        f"medians of {repeat}; ratios of CPU time (the machine is shared: wall time shown for information)",
    ]
    return BenchResult(
        ratio=ratio,
        target=TARGET,
        label="diff-render full render / pygments only",
        lines=lines,
        checks={
            "first_response_time_bounded": first_growth <= FIRST_RESPONSE_GROWTH,
            "first_response_bytes_bounded": bytes_growth <= FIRST_RESPONSE_GROWTH,
        },
    )
