"""The input limits (evolution/limits.py): pure readers, no database."""

from __future__ import annotations

import gzip
import json
import re
import time
import tracemalloc

import pytest
from django.test import override_settings

from evolution import limits
from evolution.recipes import RecipeError, parse_recipe
from evolution.surfaces import SurfaceSpecError, parse_surface
from tests.conftest import REPO_ROOT
from tests.hostile import billion_laughs, long_laughs

DEPTH = "nested more than 100 levels deep (RSI_MAX_INPUT_DEPTH)"


# --- JSON depth ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "over"),
    [
        ("[" * 100 + "]" * 100, False),
        ("[" * 101 + "]" * 101, True),
        ('{"a": ' * 100 + "1" + "}" * 100, False),
        ('{"a": [' * 50 + "1" + "]}" * 50, False),
        ('{"a": [' * 51 + "1" + "]}" * 51, True),
        # Brackets inside strings, escaped quotes included, are not nesting.
        ('["' + "[" * 500 + '"]', False),
        ('["\\"' + "[" * 500 + '\\""]', False),
        ('["\\\\", ' + "[" * 101 + "]" * 101 + "]", True),
        # An unterminated string: json.loads stops there, whatever follows.
        ('["abc' + "[" * 500, False),
        # A closing bracket too many: json.loads stops there too.
        ("[]]" + "[" * 500, False),
        ("[" * 100_000 + "]" * 100_000, True),
        ("[" * 100_000, True),
    ],
)
def test_json_depth_is_found_without_parsing(text: str, over: bool) -> None:
    assert limits.json_depth_over(text, 100) is over


def test_json_depth_agrees_with_what_json_loads_builds() -> None:
    def depth(value: object) -> int:
        if isinstance(value, dict):
            return 1 + max((depth(v) for v in value.values()), default=0)
        if isinstance(value, list):
            return 1 + max((depth(v) for v in value), default=0)
        return 0

    document = {"steps": [{"tool_calls": [{"arguments": {"a": [[{"b": "[[[{{{"}]]}}], "x": '\\"]]'}]}
    text = json.dumps(document)
    assert depth(document) == 9
    assert limits.json_depth_over(text, 9) is False
    assert limits.json_depth_over(text, 8) is True


def test_json_loads_refuses_depth_and_size_with_one_line() -> None:
    with pytest.raises(limits.InputLimitError) as refused:
        limits.json_loads("[" * 100_000 + "]" * 100_000, what="the body")
    assert str(refused.value) == f"the body is {DEPTH}"
    with pytest.raises(limits.InputLimitError) as refused:
        limits.json_loads('"' + "x" * 300_000 + '"', what="recipe", setting="RSI_MAX_RECIPE_BYTES")
    assert str(refused.value) == "recipe is larger than the limit of 256 KiB (RSI_MAX_RECIPE_BYTES)"
    assert limits.json_loads('{"a": [1, 2]}', what="x", setting="RSI_MAX_RECIPE_BYTES") == {"a": [1, 2]}


def test_the_depth_scan_is_linear_even_on_hostile_quotes() -> None:
    """Quotes that never close, each escaped: a naive string pattern retried at
    every quote would be quadratic (minutes for this text)."""
    text = '["' + '\\"' * 1_000_000 + "[" * 200
    started = time.perf_counter()
    assert limits.json_depth_over(text, 100) is False
    assert time.perf_counter() - started < 2.0


@override_settings(RSI_MAX_INPUT_DEPTH=3)
def test_the_depth_follows_the_setting() -> None:
    assert limits.json_loads("[[[]]]") == [[[]]]
    with pytest.raises(limits.InputLimitError, match=r"more than 3 levels"):
        limits.json_loads("[[[[]]]]")


# --- JSONL ---------------------------------------------------------------------------


def test_jsonl_names_the_line_and_counts_lines_up_front() -> None:
    text = '{"a": 1}\n\n' + "[" * 5000 + "]" * 5000 + "\n"
    with pytest.raises(limits.JSONLineError) as refused:
        list(limits.jsonl_loads(text))
    assert (refused.value.line, refused.value.detail, refused.value.refused) == (3, f"the line is {DEPTH}", True)
    with pytest.raises(limits.JSONLineError) as bad:
        list(limits.jsonl_loads('{"a": 1}\n{"a": \n'))
    assert (bad.value.line, bad.value.detail, bad.value.refused) == (
        2,
        "not valid JSON (Expecting value at column 7)",
        False,
    )
    with override_settings(RSI_MAX_JSONL_LINES=2):
        assert list(limits.jsonl_loads("1\n\n2\n")) == [(1, 1), (3, 2)]
        with pytest.raises(limits.InputLimitError) as many:
            limits.jsonl_loads("1\n2\n3\n").__next__()
    assert str(many.value) == "3 lines in JSONL file, over the limit of 2 (RSI_MAX_JSONL_LINES)"


# --- YAML ----------------------------------------------------------------------------


def refused_as_recipe(text: str) -> tuple[str, float, int]:
    """Why ``yaml_load`` refuses ``text`` as a recipe, the seconds it took and its peak of traced memory."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(limits.InputLimitError) as refused:
            limits.yaml_load(text, setting="RSI_MAX_RECIPE_BYTES", what="recipe")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return str(refused.value), time.perf_counter() - started, peak


def test_billion_laughs_is_refused_while_composing_and_quickly() -> None:
    text = billion_laughs()
    assert len(text) == 414
    refused, seconds, peak = refused_as_recipe(text)
    assert refused == "YAML expands to more than 10000 nodes with its aliases (RSI_MAX_YAML_NODES)"
    assert seconds < 1.0
    assert peak < 2_000_000


def test_aliases_within_the_bound_load_and_the_bound_is_exact() -> None:
    # 1 mapping + 2 keys + (list of 3 scalars = 4) + (list of 2 aliases to it = 1 + 4 + 4) = 16 nodes.
    text = "a: &a [1, 2, 3]\nb: [*a, *a]\n"
    with override_settings(RSI_MAX_YAML_NODES=16):
        assert limits.yaml_load(text, setting="RSI_MAX_SURFACE_BYTES", what="s") == {
            "a": [1, 2, 3],
            "b": [[1, 2, 3], [1, 2, 3]],
        }
    with override_settings(RSI_MAX_YAML_NODES=15), pytest.raises(limits.InputLimitError, match="more than 15 nodes"):
        limits.yaml_load(text, setting="RSI_MAX_SURFACE_BYTES", what="s")


def test_recursive_deep_and_alias_deepened_yaml_is_refused() -> None:
    def refused(text: str) -> str:
        with pytest.raises(limits.InputLimitError) as error:
            limits.yaml_load(text, setting="RSI_MAX_SURFACE_BYTES", what="s")
        return str(error.value)

    assert refused("a: &a [1, *a]\n") == "YAML holds an alias to a node that contains it (a recursive structure)"
    assert refused("x: " + "[" * 100_000 + "]" * 100_000 + "\n") == f"YAML is {DEPTH}"
    assert refused("- " * 150 + "1\n") == f"YAML is {DEPTH}"
    # Each anchor nests the previous one 40 levels down: few nodes, 200 levels once expanded.
    lines = ["a0: &a0 1"] + [f"a{n}: &a{n} " + "[" * 40 + f"*a{n - 1}" + "]" * 40 for n in range(1, 6)]
    assert refused("\n".join(lines) + "\n") == (
        "YAML is nested more than 100 levels deep with its aliases (RSI_MAX_INPUT_DEPTH)"
    )


def test_a_recipe_with_a_billion_laughs_is_a_recipe_error_and_a_small_expansion_is_refused_too() -> None:
    params = "\n".join("    " + line for line in billion_laughs().splitlines())
    recipe = f"name: laughs\nbase: rrsi\nparent_selection:\n  operator: latest_accepted\n  params:\n{params}\n"
    with pytest.raises(RecipeError) as refused:
        parse_recipe(recipe)
    assert str(refused.value) == "YAML expands to more than 10000 nodes with its aliases (RSI_MAX_YAML_NODES)"
    # Five levels (59,049 strings): finished on the old code, and its expansion was stored.
    small = "\n".join(recipe.splitlines()[:10]) + "\n"
    assert small.count("&") == 5
    with pytest.raises(RecipeError, match="RSI_MAX_YAML_NODES"):
        parse_recipe(small)
    with override_settings(RSI_MAX_YAML_NODES=100_000):
        assert len(parse_recipe(small).parent_selection.params["e"]) == 9
    with pytest.raises(RecipeError) as deep:
        parse_recipe("{" + '"a": {' * 200 + "}" * 201)
    assert str(deep.value) == f"recipe is {DEPTH}"


def test_yaml_aliases_of_long_strings_are_refused_by_the_bytes_they_expand_to() -> None:
    """Under the node limit, a few aliases of one long string expanded a
    61 KB recipe to 225 MB: the scalars' bytes after expansion are held to
    the size limit of the text, refused while composing."""
    text = long_laughs()
    assert len(text) < 25_000
    refused, seconds, peak = refused_as_recipe(text)
    assert refused == "YAML expands to more than 256 KiB of text with its aliases (RSI_MAX_RECIPE_BYTES)"
    assert seconds < 1.0
    assert peak < 2_000_000
    # The bound is exact: the keys s, l and m, then 20 + 5 * 20 + 2 * 5 * 20 bytes of scalars = 323 bytes.
    small = long_laughs(length=20, first=5, second=2)
    assert len(small) == 66
    with override_settings(RSI_MAX_SURFACE_BYTES=323):
        assert limits.yaml_load(small, setting="RSI_MAX_SURFACE_BYTES", what="s")["m"] == [["x" * 20] * 5] * 2
    with override_settings(RSI_MAX_SURFACE_BYTES=322), pytest.raises(limits.InputLimitError) as over:
        limits.yaml_load(small, setting="RSI_MAX_SURFACE_BYTES", what="s")
    assert str(over.value) == "YAML expands to more than 322 bytes of text with its aliases (RSI_MAX_SURFACE_BYTES)"


def test_a_recipe_whose_aliases_expand_past_its_size_limit_is_a_recipe_error() -> None:
    params = "\n".join("    " + line for line in long_laughs(length=2_000, first=10, second=100).splitlines())
    recipe = f"name: long\nbase: rrsi\nparent_selection:\n  operator: latest_accepted\n  params:\n{params}\n"
    with pytest.raises(RecipeError) as refused:
        parse_recipe(recipe)
    assert str(refused.value) == "YAML expands to more than 256 KiB of text with its aliases (RSI_MAX_RECIPE_BYTES)"
    with override_settings(RSI_MAX_RECIPE_BYTES=4 * 1024 * 1024):
        assert len(parse_recipe(recipe).parent_selection.params["m"]) == 100


def test_an_integer_over_pythons_digit_limit_is_refused_in_json_and_yaml() -> None:
    """int() of more than 4,300 digits raises a bare ValueError, which the
    commands did not expect (a traceback): it is refused like a limit."""
    digits = "9" * 5000
    with pytest.raises(limits.InputLimitError) as json_refused:
        limits.json_loads(f'{{"a": [-{digits}]}}', what="the file")
    assert str(json_refused.value) == (
        "the file holds an integer of more than 4300 digits (Python's int_max_str_digits)"
    )
    with pytest.raises(limits.InputLimitError) as yaml_refused:
        limits.yaml_load(f"a: {digits}\n", setting="RSI_MAX_RECIPE_BYTES", what="recipe")
    assert str(yaml_refused.value) == "YAML holds an integer of more than 4300 digits (Python's int_max_str_digits)"
    with pytest.raises(RecipeError) as recipe_refused:
        parse_recipe(f"name: big\nbase: rrsi\nparent_selection:\n  params:\n    n: {digits}\n")
    assert str(recipe_refused.value) == "YAML holds an integer of more than 4300 digits (Python's int_max_str_digits)"
    with pytest.raises(SurfaceSpecError) as surface_refused:
        parse_surface(f"include: [a]\nn: {digits}\n")
    assert "holds an integer of more than 4300 digits" in str(surface_refused.value)
    # At the limit both still read, and a long float is not an integer.
    assert limits.json_loads("[" + "9" * 4300 + ", 1." + digits + "]")[0] == int("9" * 4300)
    assert limits.yaml_load("a: " + "9" * 4300 + "\n", setting="RSI_MAX_RECIPE_BYTES", what="r") == {
        "a": int("9" * 4300)
    }


def test_a_surface_is_refused_over_its_size_pattern_count_and_pattern_length() -> None:
    with pytest.raises(SurfaceSpecError) as big:
        parse_surface("include:\n" + "".join(f"  - p/x{n}\n" for n in range(30_000)))
    assert str(big.value) == "surface is larger than the limit of 256 KiB (RSI_MAX_SURFACE_BYTES)"
    with pytest.raises(SurfaceSpecError) as many:
        parse_surface("include:\n" + "".join(f"  - p/x{n}\n" for n in range(1001)))
    assert str(many.value) == "1001 patterns in the surface, over the limit of 1000 (RSI_MAX_SURFACE_PATTERNS)"
    with pytest.raises(SurfaceSpecError) as long:
        parse_surface(f"include: [{'a' * 5000}]\n")
    assert str(long.value) == "include[0]: pattern of 5000 characters, over 4096 (RSI_MAX_PATTERN_CHARS)"
    with pytest.raises(SurfaceSpecError) as laughs:
        parse_surface("include: [a]\nexclude: [b]\n" + billion_laughs())
    assert str(laughs.value) == "YAML expands to more than 10000 nodes with its aliases (RSI_MAX_YAML_NODES)"
    assert parse_surface("include:\n" + "".join(f"  - p/x{n}\n" for n in range(1000))).include[-1] == "p/x999"


# --- gzip ----------------------------------------------------------------------------


def bomb(members: int, member_bytes: int = 64 * 1024 * 1024) -> bytes:
    """Gzip members of zeros, concatenated: ``members * member_bytes`` once decompressed."""
    one = gzip.compress(bytes(member_bytes), compresslevel=9, mtime=0)
    return one * members


def test_gunzip_stops_at_the_ratio_and_at_the_size_without_decompressing_the_rest() -> None:
    data = bomb(4)  # 256 MiB of zeros in about 260 KB
    tracemalloc.start()
    try:
        with pytest.raises(limits.InputLimitError) as refused:
            limits.gunzip(data, setting="RSI_MAX_BUNDLE_BYTES", what="the bundle")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(refused.value) == (
        f"the bundle decompresses to more than 100 times its {len(data)} bytes (RSI_MAX_DECOMPRESSION_RATIO)"
    )
    # Bounded by the ratio's cap (26 MB here), not by the 256 MiB inside.
    assert peak < 100 * len(data) * 5 // 4 + 2_000_000  # the cap, and what a growing buffer over-allocates
    with override_settings(RSI_MAX_DECOMPRESSION_RATIO=10_000), pytest.raises(limits.InputLimitError) as big:
        limits.gunzip(data, setting="RSI_MAX_RECIPE_BYTES", what="the recipe")
    assert str(big.value) == "the recipe decompresses to more than 256 KiB (RSI_MAX_RECIPE_BYTES)"
    # 2 MB that compress about 500 times: over the ratio, but under the floor it does not apply.
    text = json.dumps({"a": "b" * 2_000_000}).encode()
    with override_settings(RSI_DECOMPRESSION_RATIO_FLOOR_BYTES=4 * 1024 * 1024):
        assert limits.gunzip(gzip.compress(text), setting="RSI_MAX_BUNDLE_BYTES", what="b") == text


# --- The documentation ---------------------------------------------------------------


def test_docs_security_lists_every_limit_with_its_default() -> None:
    text = (REPO_ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\|[^|]*\|[^|]*\| ([^|]+?) \| `(RSI_[A-Z_]+)` \|$", text, flags=re.MULTILINE)
    documented = {setting: value for value, setting in rows}
    expected = {name: f"{value:,}" for name, value in limits.DEFAULTS.items()}
    assert {name: documented.get(name, "").split(" ")[0] for name in expected} == expected
