"""Surfaces and the git diff parser: pure tests, no database.

Many diffs come from a real ``git diff`` in a temporary repository so the
parser is exercised on git's own output (renames, modes, binary files,
symlinks, quoted paths); adversarial shapes git would not produce are
written by hand.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from evolution.gitdiff import DiffParseError, FileChange, Hunk, parse_git_diff, whole_file_texts
from evolution.surfaces import (
    SurfaceSpec,
    SurfaceSpecError,
    SurfaceVerdict,
    Violation,
    check_diff,
    check_paths,
    component_for,
    match_pattern,
    parse_surface,
    path_problem,
    surface_from_dict,
)

ISSUE_SURFACE = """
include: ["prompts/**", "tools/**", "config.toml"]
exclude: ["tools/internal/**"]
components: {"prompts/**": prompt, "tools/**": client_tool, "config.toml": config}
protected_keys: {"config.toml": ["model", "reasoning_effort"]}
"""

STRUCTURED_SURFACE = """
include: ["prompts/**", "config.toml", "config.json", "config.yaml", "agent.toml", "agent.yaml"]
components: {"prompts/**": prompt, "*.toml": config, "*.json": config, "*.yaml": config}
protected_keys:
  config.toml: [model, reasoning_effort]
  config.json: [model]
  config.yaml: [model]
  agent.toml: [agent.model]
  agent.yaml: [agent.model]
"""

ALL_SURFACE = """
include: ["**"]
components: {"**": prompt}
protected_keys: {"config.toml": [model]}
"""

REASON_OUTSIDE = "outside surface (matches no include pattern)"
REASON_RESERVED = "reserved path (evaluator files, task data and records are outside every surface)"
REASON_NO_SYMLINKS = "symlink not allowed (the surface does not set allow_symlinks)"
REASON_NON_ASCII = "non-ASCII path (the surface does not set allow_unicode)"

Files = Mapping[str, bytes | tuple[str, str]]


def spec(text: str = ISSUE_SURFACE, **overrides: Any) -> SurfaceSpec:
    return dataclasses.replace(parse_surface(text), **overrides)


def violations(verdict: SurfaceVerdict) -> list[tuple[str, str]]:
    return [(v.path, v.reason) for v in verdict.violations]


# --- A real git repository ------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    result = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, check=True)
    return result.stdout.decode("utf-8", errors="surrogateescape")


def _write(root: Path, files: Files) -> None:
    """``bytes`` is a regular file; ``("symlink", target)`` a symlink;
    ``("exec", text)`` an executable file."""
    for path, content in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        if isinstance(content, tuple):
            kind, value = content
            if kind == "symlink":
                target.symlink_to(value)
            else:
                target.write_text(value)
                target.chmod(0o755)
        else:
            target.write_bytes(content)


def git_diff(
    tmp_path: Path,
    before: Files,
    after: Files,
    *,
    delete: tuple[str, ...] = (),
    change: Callable[[Path], None] | None = None,
    flags: tuple[str, ...] = (),
) -> str:
    """Commit ``before``, apply ``after``/``delete``/``change``, stage all and
    return ``git diff --cached -M`` exactly as git prints it."""
    repo = tmp_path / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", ".")
    _write(repo, before)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "before")
    _write(repo, after)
    for path in delete:
        (repo / path).unlink()
    if change is not None:
        change(repo)
    _git(repo, "add", "-A")
    return _git(repo, "diff", "--cached", "--no-color", "-M", *flags)


def _rename(source: str, destination: str) -> Callable[[Path], None]:
    def move(repo: Path) -> None:
        (repo / destination).parent.mkdir(parents=True, exist_ok=True)
        (repo / source).rename(repo / destination)

    return move


def _chmod(path: str, mode: int) -> Callable[[Path], None]:
    return lambda repo: (repo / path).chmod(mode)


# --- Surface documents ------------------------------------------------------------


def test_parse_surface_reads_the_issue_example() -> None:
    parsed = parse_surface(ISSUE_SURFACE)

    assert parsed == SurfaceSpec(
        include=("prompts/**", "tools/**", "config.toml"),
        exclude=("tools/internal/**",),
        components={"prompts/**": "prompt", "tools/**": "client_tool", "config.toml": "config"},
        protected_keys={"config.toml": ("model", "reasoning_effort")},
        allow_symlinks=False,
        allow_unicode=False,
    )


def test_surface_from_dict_accepts_a_loaded_mapping() -> None:
    parsed = surface_from_dict({"include": ["a/**"], "components": {"a/**": "skill"}, "allow_symlinks": True})

    assert parsed == SurfaceSpec(include=("a/**",), components={"a/**": "skill"}, allow_symlinks=True)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param("include: []\nincludes: []", "unknown key 'includes' in surface", id="unknown-key"),
        pytest.param("exclude: []", "missing required key 'include'", id="missing-include"),
        pytest.param(
            "include: ['a/**']\ncomponents: {'a/**': prompts}",
            "components['a/**']: unknown component kind 'prompts'",
            id="unknown-kind",
        ),
        pytest.param("include: ['h/../x']", "include[0]: bad pattern 'h/../x': '..' segment", id="dotdot-pattern"),
        pytest.param("include: ['/etc/**']", "include[0]: bad pattern '/etc/**': absolute path", id="abs-pattern"),
        pytest.param("include: ['a**']", "include[0]: bad pattern 'a**': '**' must be a whole path", id="bad-**"),
        pytest.param("include: ['a/']", "include[0]: bad pattern 'a/': trailing '/'", id="trailing-slash"),
        pytest.param("exclude: ['a\\b']\ninclude: []", "exclude[0]: bad pattern 'a\\\\b': backslash", id="bs"),
        pytest.param("include: ['.git/**']", "include[0]: bad pattern '.git/**': .git internals", id="git-pattern"),
        pytest.param("include: 'a/**'", "'include' must be a list of path patterns", id="include-not-list"),
        pytest.param("include: []\nallow_symlinks: yes please", "'allow_symlinks' must be true or false", id="flag"),
        pytest.param(
            "include: []\nprotected_keys: {'notes.txt': [model]}",
            "protected_keys['notes.txt']: protected keys need a .json, .toml, .yaml or .yml file",
            id="protected-unstructured",
        ),
        pytest.param(
            "include: []\nprotected_keys: {'c.toml': ['agent..model']}",
            "protected_keys['c.toml']: bad key 'agent..model'",
            id="protected-empty-segment",
        ),
        pytest.param("include: []\ninclude: [x]", "surface is not valid YAML", id="duplicate-yaml-key"),
        pytest.param("- a\n- b", "surface must be a YAML mapping", id="not-a-mapping"),
        pytest.param("include: [", "surface is not valid YAML", id="broken-yaml"),
    ],
)
def test_parse_surface_rejects_bad_documents(document: str, message: str) -> None:
    with pytest.raises(SurfaceSpecError) as excinfo:
        parse_surface(document)

    assert str(excinfo.value).startswith(message)


# --- Patterns and component kinds ----------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        pytest.param("h/*", "h/a", True, id="star-one-segment"),
        pytest.param("h/*", "h/../secret", False, id="traversal-never-matches"),
        pytest.param("h/*", "h/./a", False, id="dot-segment-never-matches"),
        pytest.param("h/*", "h//a", False, id="empty-segment-never-matches"),
        pytest.param("h/*", "h/a/b", False, id="star-stays-in-segment"),
        pytest.param("*.md", "x/a.md", False, id="star-not-across-slash"),
        pytest.param("**", "a/b/c", True, id="doublestar-everything"),
        pytest.param("prompts/**", "prompts", True, id="doublestar-zero-segments"),
        pytest.param("prompts/**", "prompts/a/b.md", True, id="doublestar-many-segments"),
        pytest.param("prompts/**", "prompts2/a.md", False, id="doublestar-whole-segments"),
        pytest.param("a/**/b", "a/b", True, id="inner-doublestar-zero"),
        pytest.param("a/**/b", "a/x/y/b", True, id="inner-doublestar-many"),
        pytest.param("a/**/b", "a/x/y/c", False, id="inner-doublestar-mismatch"),
        pytest.param("?.md", "a.md", True, id="question-one-char"),
        pytest.param("?.md", "ab.md", False, id="question-only-one-char"),
        pytest.param("[ab].md", "a.md", False, id="brackets-are-literal"),
        pytest.param("[ab].md", "[ab].md", True, id="brackets-match-themselves"),
        pytest.param("config.toml", "Config.toml", False, id="case-sensitive"),
        pytest.param("**", "/etc/passwd", False, id="absolute-never-matches"),
    ],
)
def test_match_pattern(pattern: str, path: str, expected: bool) -> None:
    assert match_pattern(pattern, path) is expected


def test_match_pattern_rejects_a_bad_pattern() -> None:
    with pytest.raises(SurfaceSpecError, match="'\\*\\*' must be a whole path segment"):
        match_pattern("a/b**", "a/b")


def test_component_for_picks_the_most_specific_pattern() -> None:
    surface = surface_from_dict(
        {
            "include": ["**"],
            "components": {
                "**": "prompt",
                "tools/**": "client_tool",
                "tools/*.md": "skill",
                "tools/internal/run.py": "control_flow",
                "*/memory/**": "memory",
            },
        }
    )

    assert component_for(surface, "README.md") == "prompt"
    assert component_for(surface, "tools/x/y.py") == "client_tool"
    assert component_for(surface, "tools/x.md") == "skill"
    assert component_for(surface, "tools/internal/run.py") == "control_flow"
    # No literal prefix either way: more literal characters win.
    assert component_for(surface, "a/memory/b") == "memory"


def test_component_for_returns_none_without_a_matching_pattern() -> None:
    surface = surface_from_dict({"include": ["**"], "components": {"prompts/**": "prompt"}})

    assert component_for(surface, "skills/a.md") is None


# --- Paths -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        pytest.param("prompts/../config.toml", "'..' segment (path traversal)", id="traversal"),
        pytest.param("/etc/passwd", "absolute path", id="absolute"),
        pytest.param("C:/x", "absolute path", id="drive-letter"),
        pytest.param(".git/hooks/pre-commit", ".git internals", id="git-hooks"),
        pytest.param("prompts/.git/config", ".git internals", id="nested-git"),
        pytest.param("prompts/.GIT/config", ".git internals", id="git-uppercase"),
        pytest.param("prompts/.git./config", ".git internals", id="git-trailing-dot"),
        pytest.param("prompts/GIT~1/config", ".git internals", id="git-short-name"),
        pytest.param("prompts\\a.md", "backslash in path", id="backslash"),
        pytest.param("prompts/a\x00.md", "control character in path", id="nul"),
        pytest.param("prompts/a\n.md", "control character in path", id="newline"),
        pytest.param("prompts//a.md", "empty path segment", id="empty-segment"),
        pytest.param("prompts/./a.md", "'.' segment", id="dot-segment"),
        pytest.param("", "empty path", id="empty"),
        pytest.param("ｃonfig.toml", REASON_NON_ASCII, id="fullwidth"),
        pytest.param("cоnfig.toml", REASON_NON_ASCII, id="cyrillic-o"),
        pytest.param("prompts/\udcff.md", "path is not valid UTF-8", id="invalid-utf8"),
    ],
)
def test_path_problem_rejects_unsafe_paths(path: str, reason: str) -> None:
    assert path_problem(path) == reason


def test_path_problem_with_unicode_allowed_still_requires_nfc_and_no_invisibles() -> None:
    assert path_problem("prompts/é.md", allow_unicode=True) is None
    assert path_problem("prompts/e\u0301.md", allow_unicode=True) == "path is not NFC-normalized"
    assert path_problem("prompts/a\u200d.md", allow_unicode=True) == "invisible formatting character in path"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        pytest.param("prompts/system.md", None, id="included"),
        pytest.param("tools/internal/secret.py", "outside surface (excluded by 'tools/internal/**')", id="excluded"),
        pytest.param("README.md", REASON_OUTSIDE, id="not-included"),
        pytest.param("h/../prompts/a.md", "'..' segment (path traversal)", id="traversal"),
        pytest.param("/prompts/a.md", "absolute path", id="absolute"),
        pytest.param("prompts/.git/config", ".git internals", id="git-inside-include"),
    ],
)
def test_check_paths_applies_include_and_exclude(path: str, reason: str | None) -> None:
    verdict = check_paths(spec(), [path])

    assert violations(verdict) == ([] if reason is None else [(path, reason)])


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("evaluator/verify.py", id="evaluator"),
        pytest.param("tasks/t01/expected.json", id="tasks"),
        pytest.param(".rsi/state.json", id="rsi"),
        pytest.param("records/chain.json", id="records"),
        pytest.param("Evaluator/verify.py", id="evaluator-case-variant"),
        pytest.param("evaluator./verify.py", id="evaluator-trailing-dot"),
    ],
)
def test_reserved_paths_lose_even_when_include_is_everything(path: str) -> None:
    verdict = check_paths(spec(ALL_SURFACE), [path])

    assert violations(verdict) == [(path, REASON_RESERVED)]
    assert verdict.components == []


def test_extra_reserved_prefixes_are_added_to_the_defaults() -> None:
    verdict = check_paths(spec(ALL_SURFACE), ["secrets/key.txt", "tasks/a", "notes.md"], reserved=["secrets/"])

    assert violations(verdict) == [("secrets/key.txt", REASON_RESERVED)]
    assert verdict.components == ["prompt"]


def test_included_path_without_component_kind_is_a_violation() -> None:
    surface = surface_from_dict({"include": ["prompts/**", "skills/**"], "components": {"prompts/**": "prompt"}})

    verdict = check_paths(surface, ["prompts/a.md", "skills/b.md"])

    assert violations(verdict) == [("skills/b.md", "no component kind for path")]
    assert verdict.components == ["prompt"]


def test_case_fold_collision_with_a_protected_file_is_a_violation() -> None:
    verdict = check_paths(spec(ALL_SURFACE), ["Config.toml"])

    assert violations(verdict) == [("Config.toml", "case-fold collision with 'config.toml'")]


def test_case_fold_collision_with_an_existing_folder_is_a_violation() -> None:
    verdict = check_paths(spec(), ["prompts/readme.md"], known_paths=["prompts/README.md"])

    assert violations(verdict) == [("prompts/readme.md", "case-fold collision with 'prompts/README.md'")]


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("ｃonfig.toml", id="fullwidth-c"),
        pytest.param("cоnfig.toml", id="cyrillic-o"),
        pytest.param("CОNFIG.TOML", id="cyrillic-capital-o"),
    ],
)
def test_look_alike_of_an_included_file_collides_even_with_unicode_allowed(path: str) -> None:
    verdict = check_paths(spec(ALL_SURFACE, allow_unicode=True), [path])

    assert violations(verdict) == [(path, "case-fold collision with 'config.toml'")]


@pytest.mark.parametrize("path", [pytest.param("ｃonfig.toml", id="fullwidth"), pytest.param("cоnfig.toml", id="cyr")])
def test_look_alike_of_an_included_file_is_rejected_by_default(path: str) -> None:
    verdict = check_paths(spec(), [path])

    assert violations(verdict) == [(path, REASON_NON_ASCII), (path, "case-fold collision with 'config.toml'")]


# --- The diff parser on real git output -------------------------------------------------


def test_parse_git_diff_of_an_empty_text_is_empty() -> None:
    assert parse_git_diff("") == []
    assert parse_git_diff("\n") == []


def test_parse_git_diff_reads_a_real_rename_and_mode_change(tmp_path: Path) -> None:
    before = {"prompts/a.md": b"one\ntwo\n", "tools/run.sh": b"echo\n"}
    moved = _rename("prompts/a.md", "prompts/b.md")

    def change(repo: Path) -> None:
        moved(repo)
        (repo / "tools/run.sh").chmod(0o755)

    text = git_diff(tmp_path, before, {}, change=change)

    assert parse_git_diff(text) == [
        FileChange("prompts/a.md", "prompts/b.md", None, None, "renamed"),
        FileChange("tools/run.sh", "tools/run.sh", "100644", "100755", "modified"),
    ]


def test_parse_git_diff_reads_a_real_symlink_binary_and_quoted_path(tmp_path: Path) -> None:
    text = git_diff(
        tmp_path,
        {"keep.md": b"k\n"},
        {"prompts/link": ("symlink", "../keep.md"), "prompts/img.bin": b"\x00\x01\x02", "prompts/é.txt": b"e\n"},
    )

    changes = parse_git_diff(text)

    assert '"b/prompts/\\303\\251.txt"' in text
    assert [(c.old_path, c.new_path, c.old_mode, c.new_mode, c.status, c.binary) for c in changes] == [
        (None, "prompts/img.bin", None, "100644", "added", True),
        (None, "prompts/link", None, "120000", "added", False),
        (None, "prompts/é.txt", None, "100644", "added", False),
    ]
    assert changes[1].hunks == [Hunk("@@ -0,0 +1 @@", 0, 0, 1, 1, ["+../keep.md", "\\ No newline at end of file"])]
    assert whole_file_texts(changes[1]) == ("", "../keep.md")
    assert changes[2].added_lines == ["e"]


def test_parse_git_diff_reads_a_real_binary_patch(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"a.bin": b"\x00old"}, {"a.bin": b"\x00new", "b.md": b"x\n"}, flags=("--binary",))

    changes = parse_git_diff(text)

    assert "GIT binary patch" in text
    assert [(c.path, c.status, c.binary, c.hunks) for c in changes] == [
        ("a.bin", "modified", True, []),
        ("b.md", "added", False, [Hunk("@@ -0,0 +1 @@", 0, 0, 1, 1, ["+x"])]),
    ]


def test_parse_git_diff_reads_a_real_name_with_spaces(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"a b.md": b"x\n"}, {"new file.md": b"y\n"}, change=_rename("a b.md", "c d.md"))

    changes = parse_git_diff(text)

    assert [(c.old_path, c.new_path, c.status) for c in changes] == [
        ("a b.md", "c d.md", "renamed"),
        (None, "new file.md", "added"),
    ]


def test_parse_git_diff_keeps_hunk_lines_that_look_like_headers(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"a.md": b"-- x\n++ y\nkeep\n"}, {"a.md": b"++ y\nkeep\n@@ z\n"})

    (change,) = parse_git_diff(text)

    assert change.removed_lines == ["-- x"]
    assert change.added_lines == ["@@ z"]


def test_parse_git_diff_decodes_octal_escapes() -> None:
    text = textwrap.dedent(
        """\
        diff --git "a/prompts/\\303\\251 \\"q\\".txt" "b/prompts/\\303\\251 \\"q\\".txt"
        new file mode 100644
        index 0000000..e69de29
        """
    )

    (change,) = parse_git_diff(text)

    assert change.new_path == 'prompts/é "q".txt'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("hello world\n", "line 1: expected a 'diff --git' header", id="garbage"),
        pytest.param(
            "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n+b\n",
            "line 7: hunk is shorter than its header says",
            id="truncated-hunk",
        ),
        pytest.param(
            "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n+c\n",
            "line 7: unexpected line '+c'",
            id="hunk-too-long",
        ),
        pytest.param(
            "diff --git a/x b/x\n--- a/x\n+++ b/evaluator/verify.py\n@@ -1 +1 @@\n-a\n+b\n",
            "line 1: inconsistent new file names",
            id="inconsistent-names",
        ),
        pytest.param("diff --git a/x b/x\nwhatever\n", "line 2: unexpected extended header line", id="bad-header"),
        pytest.param("diff --git a/x b/x\nold mode 100644\n", "line 1: 'old mode' and 'new mode'", id="half-mode"),
        pytest.param('diff --git "a/\\q" "b/\\q"\n', "line 1: bad escape in quoted file name", id="bad-escape"),
        pytest.param("diff --git a/x b/x\n@@ -1 +1 @@\n-a\n+b\n", "line 2: hunk without '---'/'+++'", id="no-files"),
        pytest.param("diff --git x y\n", "line 1: 'diff --git' header names must start", id="no-prefix"),
        pytest.param(
            "diff --git a/prompts/a.md b/evaluator/v.py\nindex 1111111..2222222 100644\n",
            "line 1: file name changes from 'prompts/a.md' to 'evaluator/v.py' without a rename",
            id="name-change-without-rename",
        ),
        pytest.param(
            "diff --git a/x b/x\nnew file mode 100644\nrename from x\nrename to y\n",
            "line 1: contradictory headers: added and renamed",
            id="added-and-renamed",
        ),
    ],
)
def test_parse_git_diff_rejects_garbage_with_a_line_number(text: str, message: str) -> None:
    with pytest.raises(DiffParseError) as excinfo:
        parse_git_diff(text)

    assert str(excinfo.value).startswith(message)


def test_whole_file_texts_trusts_only_full_length_index_ids(tmp_path: Path) -> None:
    before, after = {"c.toml": b'a = 1\nmodel = "x"\n'}, {"c.toml": b'a = 2\nmodel = "x"\n'}
    short = parse_git_diff(git_diff(tmp_path / "short", before, after))
    full = parse_git_diff(git_diff(tmp_path / "full", before, after, flags=("--full-index",)))

    assert whole_file_texts(short[0]) == (None, None)
    assert whole_file_texts(full[0]) == ('a = 1\nmodel = "x"\n', 'a = 2\nmodel = "x"\n')


def test_whole_file_texts_is_unknown_for_a_hunk_in_the_middle(tmp_path: Path) -> None:
    lines = b"".join(b"line %d\n" % i for i in range(20))
    text = git_diff(tmp_path, {"a.md": lines}, {"a.md": lines.replace(b"line 10", b"ten")}, flags=("--full-index",))

    assert whole_file_texts(parse_git_diff(text)[0]) == (None, None)


# --- check_diff: structure ---------------------------------------------------------------


def test_empty_diff_is_allowed_with_no_components() -> None:
    verdict = check_diff(spec(), "")

    assert verdict == SurfaceVerdict(allowed=True, violations=[], components=[])
    assert verdict.to_json() == {"allowed": True, "violations": [], "components": []}


def test_garbage_diff_raises() -> None:
    with pytest.raises(DiffParseError, match="line 1"):
        check_diff(spec(), "not a diff\n")


def test_edits_inside_the_surface_are_allowed_and_report_components(tmp_path: Path) -> None:
    text = git_diff(
        tmp_path,
        {"prompts/system.md": b"be careful\n", "tools/search.py": b"pass\n"},
        {"prompts/system.md": b"be very careful\n", "tools/search.py": b"return 1\n"},
    )

    verdict = check_diff(spec(), text)

    assert verdict.to_json() == {"allowed": True, "violations": [], "components": ["client_tool", "prompt"]}


def test_excluded_subtree_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"tools/internal/x.py": b"a\n"}, {"tools/internal/x.py": b"b\n"})

    verdict = check_diff(spec(), text)

    assert violations(verdict) == [("tools/internal/x.py", "outside surface (excluded by 'tools/internal/**')")]
    assert verdict.allowed is False


def test_reserved_evaluator_file_is_a_violation_even_when_include_is_everything(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"evaluator/verify.py": b"ok\n"}, {"evaluator/verify.py": b"always pass\n"})

    verdict = check_diff(spec(ALL_SURFACE), text)

    assert violations(verdict) == [("evaluator/verify.py", REASON_RESERVED)]
    assert verdict.components == []


def test_traversal_path_in_a_diff_is_a_violation() -> None:
    text = "diff --git a/h/../secret b/h/../secret\nnew file mode 100644\nindex 0000000..e69de29\n"

    verdict = check_diff(spec(ALL_SURFACE), text)

    assert violations(verdict) == [("h/../secret", "'..' segment (path traversal)")]


def test_absolute_and_backslash_paths_in_a_diff_are_violations() -> None:
    text = (
        'diff --git "a//etc/passwd" "b//etc/passwd"\nnew file mode 100644\nindex 0000000..e69de29\n'
        'diff --git "a/prompts\\\\..\\\\x" "b/prompts\\\\..\\\\x"\nnew file mode 100644\nindex 0000000..e69de29\n'
    )

    verdict = check_diff(spec(ALL_SURFACE), text)

    assert violations(verdict) == [
        ("/etc/passwd", "absolute path"),
        ("prompts\\..\\x", "backslash in path"),
    ]


@pytest.mark.parametrize(
    "path",
    [pytest.param(".git/hooks/pre-commit", id="git-hooks"), pytest.param("prompts/.git/config", id="nested-git")],
)
def test_git_internals_in_a_diff_are_violations(path: str) -> None:
    text = f"diff --git a/{path} b/{path}\nnew file mode 100755\nindex 0000000..e69de29\n"

    verdict = check_diff(spec(ALL_SURFACE), text)

    assert violations(verdict) == [(path, ".git internals")]


def test_quoted_non_ascii_path_needs_allow_unicode(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {}, {"prompts/é.txt": b"e\n"})

    assert violations(check_diff(spec(), text)) == [("prompts/é.txt", REASON_NON_ASCII)]
    assert check_diff(spec(allow_unicode=True), text).to_json() == {
        "allowed": True,
        "violations": [],
        "components": ["prompt"],
    }


def test_fullwidth_look_alike_in_a_diff_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"config.toml": b'model = "x"\n'}, {"ｃonfig.toml": b'model = "y"\n'})

    assert violations(check_diff(spec(), text)) == [
        ("ｃonfig.toml", REASON_NON_ASCII),
        ("ｃonfig.toml", "case-fold collision with 'config.toml'"),
    ]
    assert violations(check_diff(spec(ALL_SURFACE, allow_unicode=True), text)) == [
        ("ｃonfig.toml", "case-fold collision with 'config.toml'")
    ]


def test_cyrillic_look_alike_in_a_diff_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {}, {"cоnfig.toml": b'model = "y"\n'})

    assert violations(check_diff(spec(), text)) == [
        ("cоnfig.toml", REASON_NON_ASCII),
        ("cоnfig.toml", "case-fold collision with 'config.toml'"),
    ]
    assert violations(check_diff(spec(ALL_SURFACE, allow_unicode=True), text)) == [
        ("cоnfig.toml", "case-fold collision with 'config.toml'")
    ]


def test_case_fold_collision_with_an_existing_file_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"prompts/README.md": b"a\n"}, {"prompts/readme.md": b"b\n"})

    verdict = check_diff(spec(), text, old_files={"prompts/README.md": b"a\n"})

    assert violations(verdict) == [("prompts/readme.md", "case-fold collision with 'prompts/README.md'")]


def test_case_fold_collision_config_toml_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"config.toml": b'model = "x"\n'}, {"Config.toml": b'model = "y"\n'})

    verdict = check_diff(spec(ALL_SURFACE), text)

    assert violations(verdict) == [("Config.toml", "case-fold collision with 'config.toml'")]


def test_case_only_rename_is_not_a_collision_with_itself(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"prompts/A.md": b"a\n"}, {}, change=_rename("prompts/A.md", "prompts/a.md"))

    verdict = check_diff(spec(), text, old_files={"prompts/A.md": b"a\n"})

    assert verdict.to_json() == {"allowed": True, "violations": [], "components": ["prompt"]}


def test_rename_from_inside_to_outside_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"prompts/a.md": b"hello\n"}, {}, change=_rename("prompts/a.md", "evaluator/a.md"))

    verdict = check_diff(spec(), text)

    assert violations(verdict) == [("evaluator/a.md", REASON_RESERVED + " (rename destination)")]
    assert verdict.components == ["prompt"]


def test_rename_from_outside_to_inside_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"notes/a.md": b"hello\n"}, {}, change=_rename("notes/a.md", "prompts/a.md"))

    verdict = check_diff(spec(), text)

    assert violations(verdict) == [("notes/a.md", REASON_OUTSIDE + " (rename source)")]


def test_copy_from_a_reserved_path_is_a_violation() -> None:
    text = (
        "diff --git a/evaluator/verify.py b/prompts/hint.md\nsimilarity index 100%\n"
        "copy from evaluator/verify.py\ncopy to prompts/hint.md\n"
    )

    verdict = check_diff(spec(), text)

    assert violations(verdict) == [("evaluator/verify.py", "copy source is a reserved path (copy source)")]
    assert verdict.components == ["prompt"]


def test_executable_bit_change_inside_is_allowed(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"tools/run.sh": b"echo\n"}, {}, change=_chmod("tools/run.sh", 0o755))

    verdict = check_diff(spec(), text)

    assert verdict.to_json() == {"allowed": True, "violations": [], "components": ["client_tool"]}


def test_mode_change_to_symlink_is_a_violation_even_with_symlinks_allowed() -> None:
    text = (
        "diff --git a/prompts/a.md b/prompts/a.md\nold mode 100644\nnew mode 120000\n"
        "--- a/prompts/a.md\n+++ b/prompts/a.md\n@@ -1 +1 @@\n-hello\n+b.md\n\\ No newline at end of file\n"
    )

    verdict = check_diff(spec(allow_symlinks=True), text)

    assert violations(verdict) == [
        ("prompts/a.md", "mode change 100644 -> 120000 not allowed (only 100644 <-> 100755)")
    ]


def test_gitlink_is_a_violation() -> None:
    text = "diff --git a/prompts/sub b/prompts/sub\nnew file mode 160000\nindex 0000000..1234567\n"

    verdict = check_diff(spec(), text)

    assert violations(verdict) == [("prompts/sub", "submodule (gitlink) entries are not allowed")]


def test_symlink_added_is_a_violation_without_allow_symlinks(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"prompts/a.md": b"a\n"}, {"prompts/link.md": ("symlink", "a.md")})

    verdict = check_diff(spec(), text)

    assert violations(verdict) == [("prompts/link.md", REASON_NO_SYMLINKS)]


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        pytest.param("../../etc/passwd", "symlink target '../../etc/passwd' leaves the repository", id="escapes"),
        pytest.param("/etc/passwd", "symlink target '/etc/passwd' is absolute", id="absolute"),
        pytest.param(
            "../evaluator/verify.py",
            "symlink target '../evaluator/verify.py' resolves outside the surface ('evaluator/verify.py')",
            id="reserved",
        ),
        pytest.param(
            "../tools/internal/x.py",
            "symlink target '../tools/internal/x.py' resolves outside the surface ('tools/internal/x.py')",
            id="excluded",
        ),
    ],
)
def test_symlink_pointing_outside_is_a_violation(tmp_path: Path, target: str, reason: str) -> None:
    text = git_diff(tmp_path, {}, {"prompts/link": ("symlink", target)})

    verdict = check_diff(spec(allow_symlinks=True), text)

    assert violations(verdict) == [("prompts/link", reason)]


def test_symlink_inside_the_surface_is_allowed_when_enabled(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"tools/a.py": b"x\n"}, {"prompts/link": ("symlink", "../tools/a.py")})

    verdict = check_diff(spec(allow_symlinks=True), text)

    assert verdict.to_json() == {"allowed": True, "violations": [], "components": ["prompt"]}


def test_symlink_replacing_an_in_surface_file_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"prompts/a.md": b"a\n"}, {"prompts/a.md": ("symlink", "../../outside")})

    verdict = check_diff(spec(), text)

    assert [(c.status, c.new_mode) for c in parse_git_diff(text)] == [("deleted", None), ("added", "120000")]
    assert violations(verdict) == [("prompts/a.md", REASON_NO_SYMLINKS)]


def test_binary_file_inside_the_surface_is_allowed(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"prompts/img.png": b"\x89PNG\x00a"}, {"prompts/img.png": b"\x89PNG\x00b"})

    verdict = check_diff(spec(), text)

    assert "Binary files a/prompts/img.png and b/prompts/img.png differ" in text
    assert verdict.to_json() == {"allowed": True, "violations": [], "components": ["prompt"]}


def test_binary_file_outside_the_surface_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {}, {"data/img.png": b"\x89PNG\x00a"}, flags=("--binary",))

    verdict = check_diff(spec(), text)

    assert violations(verdict) == [("data/img.png", REASON_OUTSIDE)]


# --- check_diff: protected keys ------------------------------------------------------------

PROTECTED_CASES = [
    pytest.param("config.toml", b'model = "a"\nreasoning_effort = "low"\n', b'model = "b"\nreasoning_effort = "low"\n',
                 "model", id="toml"),
    pytest.param("config.toml", b'model = "a"\nreasoning_effort = 1\n', b'model = "a"\nreasoning_effort = true\n',
                 "reasoning_effort", id="toml-1-vs-true"),
    pytest.param("config.json", b'{"model": "a", "t": 1}\n', b'{"model": "b", "t": 1}\n', "model", id="json"),
    pytest.param("config.yaml", b"model: a\nt: 1\n", b"model: b\nt: 1\n", "model", id="yaml"),
    pytest.param("agent.toml", b'[agent]\nmodel = "a"\nname = "x"\n', b'[agent]\nmodel = "b"\nname = "x"\n',
                 "agent.model", id="toml-nested"),
    pytest.param("agent.toml", b'[agent]\nname = "x"\nmodel = "a"\n', b'[agent]\nname = "x"\n[other]\nmodel = "a"\n',
                 "agent.model", id="toml-moved-under-another-table"),
    pytest.param("agent.yaml", b"agent:\n  model: a\n  name: x\n", b"agent:\n  model: b\n  name: x\n",
                 "agent.model", id="yaml-nested"),
    pytest.param("config.yaml", b"model: a\n", b"t: 1\n", "model", id="yaml-key-removed"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "old", "new", "key"), PROTECTED_CASES)
def test_protected_key_changed_is_a_violation(tmp_path: Path, path: str, old: bytes, new: bytes, key: str) -> None:
    text = git_diff(tmp_path, {path: old}, {path: new})

    verdict = check_diff(spec(STRUCTURED_SURFACE), text, old_files={path: old}, new_files={path: new})

    assert violations(verdict) == [(path, f"protected key {key!r} changed")]
    assert verdict.components == ["config"]


@pytest.mark.parametrize(("path", "old", "new", "key"), PROTECTED_CASES)
def test_protected_key_change_is_found_from_full_index_hunks(
    tmp_path: Path, path: str, old: bytes, new: bytes, key: str
) -> None:
    text = git_diff(tmp_path, {path: old}, {path: new}, flags=("--full-index",))

    verdict = check_diff(spec(STRUCTURED_SURFACE), text)

    assert violations(verdict) == [(path, f"protected key {key!r} changed")]


UNCHANGED_CASES = [
    pytest.param("config.toml", b'model = "a"\nt = 1\n', b'# note\nmodel = "a"\nt = 2\n', id="toml"),
    pytest.param("config.json", b'{"model": "a", "t": 1}\n', b'{\n  "t": 2,\n  "model": "a"\n}\n', id="json"),
    pytest.param("config.yaml", b"model: a\nt: 1\n", b"t: 2\nmodel: 'a'\n", id="yaml"),
    pytest.param("agent.toml", b'[agent]\nmodel = "a"\n', b'agent = { model = "a", name = "n" }\n', id="toml-nested"),
]


@pytest.mark.parametrize(("path", "old", "new"), UNCHANGED_CASES)
def test_protected_key_unchanged_while_other_keys_change_is_allowed(
    tmp_path: Path, path: str, old: bytes, new: bytes
) -> None:
    text = git_diff(tmp_path, {path: old}, {path: new})

    verdict = check_diff(spec(STRUCTURED_SURFACE), text, old_files={path: old}, new_files={path: new})

    assert verdict.to_json() == {"allowed": True, "violations": [], "components": ["config"]}


def test_protected_key_unchanged_is_allowed_from_full_index_hunks(tmp_path: Path) -> None:
    old, new = b'model = "a"\nt = 1\n', b'model = "a"\nt = 2\n'
    text = git_diff(tmp_path, {"config.toml": old}, {"config.toml": new}, flags=("--full-index",))

    verdict = check_diff(spec(STRUCTURED_SURFACE), text)

    assert verdict.to_json() == {"allowed": True, "violations": [], "components": ["config"]}


@pytest.mark.parametrize(
    ("path", "old", "new"),
    [
        pytest.param("config.toml", b'model = "a"\n', b'model = "a\n', id="toml"),
        pytest.param("config.json", b'{"model": "a"}\n', b'{"model": "a",}\n', id="json"),
        pytest.param("config.json", b'{"model": "a"}\n', b'{"model": "a", "model": "b"}\n', id="json-duplicate"),
        pytest.param("config.yaml", b"model: a\n", b"model: a\nmodel: b\n", id="yaml-duplicate"),
        pytest.param("config.yaml", b"model: a\n", b"model: [a\n", id="yaml"),
    ],
)
def test_file_with_protected_keys_made_unparseable_is_a_violation(
    tmp_path: Path, path: str, old: bytes, new: bytes
) -> None:
    text = git_diff(tmp_path, {path: old}, {path: new})

    verdict = check_diff(spec(STRUCTURED_SURFACE), text, old_files={path: old}, new_files={path: new})

    assert [(v.path, v.reason.split(":")[0]) for v in verdict.violations] == [
        (path, "file with protected keys no longer parses")
    ]


def test_deleting_a_file_with_protected_keys_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"config.toml": b'model = "a"\n'}, {}, delete=("config.toml",))

    verdict = check_diff(spec(STRUCTURED_SURFACE), text)

    assert violations(verdict) == [("config.toml", "protected key 'model' changed")]


def test_renaming_a_file_with_protected_keys_away_is_a_violation(tmp_path: Path) -> None:
    old = b'model = "a"\n'
    text = git_diff(tmp_path, {"config.toml": old}, {}, change=_rename("config.toml", "agent.toml"))

    verdict = check_diff(spec(STRUCTURED_SURFACE), text, old_files={"config.toml": old}, new_files={"agent.toml": old})

    assert violations(verdict) == [("config.toml", "protected key 'model' changed")]


def test_adding_a_protected_file_that_sets_a_protected_key_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {}, {"config.yaml": b"model: a\nt: 1\n"})

    verdict = check_diff(spec(STRUCTURED_SURFACE), text)

    assert violations(verdict) == [("config.yaml", "protected key 'model' changed")]


def test_binary_change_to_a_protected_file_is_a_violation(tmp_path: Path) -> None:
    text = git_diff(tmp_path, {"config.json": b'{"model": "a"}'}, {"config.json": b'{"model": "a"}\x00'})

    verdict = check_diff(spec(STRUCTURED_SURFACE), text)

    assert violations(verdict) == [("config.json", "binary change to a file with protected keys")]


# Twenty unrelated lines push the hunk away from the start of the file, so
# the diff does not hold the whole document and the fallback applies.
_TOML_PAD = b"".join(b"k%d = %d\n" % (i, i) for i in range(20))
_YAML_PAD = b"".join(b"k%d: %d\n" % (i, i) for i in range(20))
_JSON_PAD = b"{\n" + b"".join(b'"k%d": %d,\n' % (i, i) for i in range(20))
_NAMES_KEY = "protected key {!r} may have changed (diff lacks the whole file; a changed line names it)"
_MOVES_KEYS = "protected keys may have moved (diff lacks the whole file; a changed line alters nesting)"


@pytest.mark.parametrize(
    ("path", "old", "new", "reasons"),
    [
        pytest.param(
            "config.toml", _TOML_PAD + b'model = "a"\n', _TOML_PAD + b'model = "b"\n', [_NAMES_KEY.format("model")],
            id="toml-key-line",
        ),
        pytest.param(
            "agent.toml", _TOML_PAD + b'[agent]\nz = 1\nmodel = "a"\n',
            _TOML_PAD + b'[agent]\nz = 1\n[other]\nmodel = "a"\n', [_MOVES_KEYS],
            id="toml-table-header",
        ),
        pytest.param(
            "config.yaml", _YAML_PAD + b"model: a\n", _YAML_PAD + b"model: b\n", [_NAMES_KEY.format("model")],
            id="yaml-key-line",
        ),
        pytest.param(
            "agent.yaml", _YAML_PAD + b"agent:\n  z: 1\n  model: a\n",
            _YAML_PAD + b"agent:\n  z: 1\nother:\n  model: a\n", [_MOVES_KEYS],
            id="yaml-new-parent",
        ),
        pytest.param(
            "config.json", _JSON_PAD + b'"model": "a"\n}\n', _JSON_PAD + b'"model": "b"\n}\n',
            [_NAMES_KEY.format("model")],
            id="json-key-line",
        ),
        pytest.param(
            "config.json", _JSON_PAD + b'"model": "a"\n}\n', _JSON_PAD + b'"mod\\u0065l": "b"\n}\n',
            [_NAMES_KEY.format("model"), _MOVES_KEYS],
            id="json-escaped-key",
        ),
    ],
)  # fmt: skip
def test_partial_hunk_fallback_flags_lines_touching_protected_keys(
    tmp_path: Path, path: str, old: bytes, new: bytes, reasons: list[str]
) -> None:
    text = git_diff(tmp_path, {path: old}, {path: new})

    verdict = check_diff(spec(STRUCTURED_SURFACE), text)

    assert whole_file_texts(parse_git_diff(text)[0]) == (None, None)
    assert violations(verdict) == [(path, reason) for reason in reasons]


@pytest.mark.parametrize(
    ("path", "old", "new"),
    [
        pytest.param("config.toml", _TOML_PAD + b'model = "a"\nsteps = 1\n', _TOML_PAD + b'model = "a"\nsteps = 2\n',
                     id="toml"),
        pytest.param("config.yaml", _YAML_PAD + b"model: a\nsteps: 1\n", _YAML_PAD + b"model: a\nsteps: 2\n",
                     id="yaml"),
        pytest.param("config.json", _JSON_PAD + b'"model": "a",\n"steps": 1\n}\n',
                     _JSON_PAD + b'"model": "a",\n"steps": 2\n}\n', id="json"),
    ],
)  # fmt: skip
def test_partial_hunk_fallback_allows_unrelated_lines(tmp_path: Path, path: str, old: bytes, new: bytes) -> None:
    text = git_diff(tmp_path, {path: old}, {path: new})

    verdict = check_diff(spec(STRUCTURED_SURFACE), text)

    assert whole_file_texts(parse_git_diff(text)[0]) == (None, None)
    assert verdict.to_json() == {"allowed": True, "violations": [], "components": ["config"]}


def test_violation_and_verdict_serialize_to_json() -> None:
    verdict = SurfaceVerdict(allowed=False, violations=[Violation("a", "why")], components=["prompt"])

    assert verdict.to_json() == {
        "allowed": False,
        "violations": [{"path": "a", "reason": "why"}],
        "components": ["prompt"],
    }


# --- refuse_hidden_characters ------------------------------------------------------------

TROJAN = "/*\u202e } \u2066if (isAdmin)\u2069 \u2066 begin admins only */\n"
HIDDEN_REASON = "(the surface sets refuse_hidden_characters)"


def test_refuse_hidden_characters_refuses_a_git_diff_that_adds_them(tmp_path: Path) -> None:
    diff = git_diff(
        tmp_path,
        {"prompts/a.md": b"a\n", "prompts/b.md": "keep \u200b\n".encode()},
        {"prompts/a.md": ("a\n" + TROJAN).encode(), "prompts/c.md": "p\u0430ss\n".encode()},
    )
    strict = spec(refuse_hidden_characters=True)
    assert violations(check_diff(strict, diff)) == [
        (
            "prompts/a.md",
            "adds hidden characters: U+202E RIGHT-TO-LEFT OVERRIDE (bidi) on line 2, column 3; "
            "U+2066 LEFT-TO-RIGHT ISOLATE (bidi) on line 2, column 7; "
            "U+2069 POP DIRECTIONAL ISOLATE (bidi) on line 2, column 20; "
            "U+2066 LEFT-TO-RIGHT ISOLATE (bidi) on line 2, column 22 " + HIDDEN_REASON,
        ),
        (
            "prompts/c.md",
            "adds hidden characters: U+0430 CYRILLIC SMALL LETTER A (look-alike) on line 1, column 2 " + HIDDEN_REASON,
        ),
    ]
    # Off by default: the same diff passes the surface (the critic and the screens still see it).
    assert check_diff(spec(), diff).allowed is True


def test_refuse_hidden_characters_names_five_and_counts_the_rest() -> None:
    diff = (
        "diff --git a/prompts/a.md b/prompts/a.md\nnew file mode 100644\nindex 0000000..1111111\n"
        "--- /dev/null\n+++ b/prompts/a.md\n@@ -0,0 +1 @@\n+" + "x\u200b" * 8 + "\n"
    )
    (violation,) = check_diff(spec(refuse_hidden_characters=True), diff).violations
    assert violation.reason.count("U+200B ZERO WIDTH SPACE") == 5
    assert violation.reason.endswith("; and 3 more " + HIDDEN_REASON)


def test_refuse_hidden_characters_allows_what_the_parent_had_and_a_leading_bom(tmp_path: Path) -> None:
    diff = git_diff(
        tmp_path,
        {"prompts/a.md": "one \u200b\ntwo\n".encode()},
        {"prompts/a.md": "two\none \u200b\n".encode(), "prompts/bom.md": "\ufeff# title\n".encode()},
    )
    assert violations(check_diff(spec(refuse_hidden_characters=True), diff)) == []


def test_refuse_hidden_characters_must_be_a_boolean() -> None:
    with pytest.raises(SurfaceSpecError, match="'refuse_hidden_characters' must be true or false"):
        parse_surface(ISSUE_SURFACE + "refuse_hidden_characters: sometimes\n")
    assert parse_surface(ISSUE_SURFACE + "refuse_hidden_characters: true\n").refuse_hidden_characters is True
    assert parse_surface(ISSUE_SURFACE).refuse_hidden_characters is False
