"""Unit tests for evolution.recipes: parsing, normalization, digests, presets."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from evolution.loop.regularization import GateParams
from evolution.recipes import (
    BUILTIN_OPERATORS,
    PRESET_DIR,
    PRESET_NAMES,
    Recipe,
    RecipeError,
    gate_params,
    load_preset,
    parse_recipe,
    recipe_digest,
    recipe_to_dict,
)

SWITCHES = ("edit_budget", "ledger", "stall", "critique", "noise", "admissibility", "pruning")


def switches(recipe: Recipe) -> dict[str, bool]:
    return {name: getattr(recipe, name).enabled for name in SWITCHES}


def reversed_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(item) for item in value]
    return value


def raises_at(path: str, message: str) -> Any:
    """pytest.raises for a RecipeError whose message is exactly ``path: message...``."""
    return pytest.raises(RecipeError, match=f"^{re.escape(f'{path}: {message}')}")


# --- Presets ---------------------------------------------------------------------------------


def load_preset_text(name: str) -> str:
    return (PRESET_DIR / f"{name}.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_parses_with_the_builtin_operators_and_round_trips(name: str) -> None:
    recipe = parse_recipe(load_preset_text(name), known_operators=BUILTIN_OPERATORS)

    assert recipe == load_preset(name)
    assert recipe.name == name
    assert parse_recipe(recipe_to_dict(recipe)) == recipe
    assert parse_recipe(json.dumps(recipe_to_dict(recipe))) == recipe


def test_preset_digests_all_differ() -> None:
    digests = {recipe_digest(load_preset(name)) for name in PRESET_NAMES}

    assert len(digests) == len(PRESET_NAMES)


def test_digest_does_not_depend_on_key_order_or_format() -> None:
    recipe = load_preset("rrsi")
    as_dict = recipe_to_dict(recipe)

    permuted = parse_recipe(reversed_keys(as_dict))
    from_json = parse_recipe(json.dumps(reversed_keys(as_dict)))
    from_yaml = parse_recipe(yaml.safe_dump(as_dict, sort_keys=True))

    assert list(reversed_keys(as_dict)) != list(as_dict)
    assert recipe_digest(permuted) == recipe_digest(recipe)
    assert recipe_digest(from_json) == recipe_digest(recipe)
    assert recipe_digest(from_yaml) == recipe_digest(recipe)
    assert recipe_digest(recipe) == recipe_digest(load_preset("rrsi"))


def test_digest_changes_with_any_parameter() -> None:
    base = recipe_to_dict(load_preset("rrsi"))
    changed = {**base, "admissibility": {**base["admissibility"], "c1": 0.1}}

    assert recipe_digest(parse_recipe(changed)) != recipe_digest(load_preset("rrsi"))


def test_defaults_are_the_rrsi_preset() -> None:
    rrsi = load_preset("rrsi")

    assert parse_recipe({"name": "rrsi", "description": rrsi.description}) == rrsi


def test_rrsi_has_the_published_coding_settings() -> None:
    recipe = load_preset("rrsi")

    assert switches(recipe) == dict.fromkeys(SWITCHES, True)
    assert (recipe.edit_budget.k_max, recipe.edit_budget.k_min, recipe.edit_budget.T) == (4, 1, recipe.rounds)
    assert (recipe.stall.w, recipe.stall.m_draft) == (3, 1)
    assert (recipe.admissibility.c1, recipe.admissibility.score_unit, recipe.admissibility.score_unit_size) == (
        0.25,
        "trial",
        1.0,
    )
    assert recipe.admissibility.lambda_S == 0.0
    assert (recipe.admissibility.valid_output_drop, recipe.admissibility.no_submission_rise) == (0.03, 0.02)
    assert (recipe.critique.operator, recipe.critique.leakage_policy) == ("rules", "review")
    assert recipe.evaluation.evolve_splits == ("train", "gate")
    assert recipe.evaluation.trials_per_task == 2
    assert recipe.gate.operator == "regularized"


def test_unregularized_preset_switches_everything_off() -> None:
    recipe = load_preset("unregularized")

    assert switches(recipe) == dict.fromkeys(SWITCHES, False)
    assert (recipe.gate.operator, recipe.parent_selection.operator) == ("unregularized", "best")
    assert (recipe.critique.operator, recipe.critique.leakage_policy) == ("none", "off")
    assert recipe.pruning.operator == "none"
    assert recipe.needs_noise_estimate is False


def test_ablation_presets_switch_one_side_each() -> None:
    no_selection = load_preset("rrsi-no-selection")
    no_proposal = load_preset("rrsi-no-proposal")
    proposal_side = {"edit_budget": True, "ledger": True, "stall": True}
    selection_side = {"critique": True, "noise": True, "admissibility": True, "pruning": True}

    assert switches(no_selection) == {**proposal_side, **dict.fromkeys(selection_side, False)}
    assert switches(no_proposal) == {**dict.fromkeys(proposal_side, False), **selection_side}
    assert no_selection.gate.operator == "unregularized"
    assert no_proposal.gate.operator == "regularized"
    # The stall detector still needs delta when the noise band is off.
    assert no_selection.needs_noise_estimate is True


def test_pareto_and_archive_presets() -> None:
    pareto = load_preset("pareto")
    archive = load_preset("archive")

    assert pareto.parent_selection.operator == "pareto"
    assert (pareto.evaluation.minibatch.enabled, pareto.evaluation.minibatch.size) == (True, 8)
    assert pareto.evaluation.minibatch.required_rate == 0.5
    assert archive.parent_selection.operator == "archive"
    assert archive.evaluation.minibatch.enabled is False
    for recipe in (pareto, archive):
        assert (recipe.gate.operator, recipe.gate.accept) == ("regularized", "admissible")
        assert switches(recipe) == dict.fromkeys(SWITCHES, False)


def test_load_preset_rejects_an_unknown_name() -> None:
    with pytest.raises(RecipeError, match="^unknown preset 'rrsi2' \\(known: rrsi, unregularized, "):
        load_preset("rrsi2")


# --- Parsing and normalization ------------------------------------------------------------------


def test_parse_recipe_reads_json_text() -> None:
    recipe = parse_recipe(
        '{"name": "j", "rounds": 5, "admissibility": {"c1": 1e-1}, "evaluation": {"sealed": "never"}}'
    )

    assert (recipe.name, recipe.rounds, recipe.edit_budget.T) == ("j", 5, 5)
    assert recipe.admissibility.c1 == 0.1
    assert recipe.evaluation.sealed == "never"


def test_parse_recipe_reads_yaml_bytes() -> None:
    recipe = parse_recipe(b"name: y\nevaluation: {evolve_splits: [gate]}\n")

    assert recipe.evaluation.evolve_splits == ("gate",)


def test_t_defaults_to_rounds_and_is_stored_filled_in() -> None:
    implicit = parse_recipe({"name": "x", "rounds": 7})
    explicit = parse_recipe({"name": "x", "rounds": 7, "edit_budget": {"T": 7}})
    null = parse_recipe({"name": "x", "rounds": 7, "edit_budget": {"T": None}})

    assert implicit.edit_budget.T == 7
    assert implicit == explicit == null
    assert recipe_to_dict(implicit)["edit_budget"] == {"enabled": True, "k_max": 4, "k_min": 1, "T": 7}


def test_evolve_splits_are_normalized_to_one_order() -> None:
    one = parse_recipe({"name": "x", "evaluation": {"evolve_splits": ["gate", "train"]}})
    other = parse_recipe({"name": "x", "evaluation": {"evolve_splits": ["train", "gate"]}})

    assert one.evaluation.evolve_splits == ("train", "gate")
    assert recipe_digest(one) == recipe_digest(other)


def test_integers_and_floats_normalize_to_one_form() -> None:
    as_int = parse_recipe({"name": "x", "admissibility": {"c0": 0, "lambda_C": 1}})
    as_float = parse_recipe({"name": "x", "admissibility": {"c0": 0.0, "lambda_C": 1.0}})

    assert recipe_to_dict(as_int) == recipe_to_dict(as_float)
    assert recipe_digest(as_int) == recipe_digest(as_float)


def test_critique_switched_off_by_operator_none_or_enabled_false() -> None:
    by_operator = parse_recipe({"name": "x", "critique": {"operator": "none"}})
    by_flag = parse_recipe({"name": "x", "critique": {"enabled": False, "operator": "rules"}})

    assert by_operator.critique == by_flag.critique
    assert (by_flag.critique.enabled, by_flag.critique.operator, by_flag.critique.leakage_policy) == (
        False,
        "none",
        "off",
    )


def test_critique_can_audit_without_acting() -> None:
    recipe = parse_recipe({"name": "x", "critique": {"leakage_policy": "off"}})

    assert (recipe.critique.enabled, recipe.critique.operator, recipe.critique.leakage_policy) == (
        True,
        "rules",
        "off",
    )


def test_operator_params_are_kept_read_only_and_exported_as_plain_json() -> None:
    recipe = parse_recipe(
        {"name": "x", "proposal": {"operator": "command", "params": {"argv": ["python", "p.py"], "env": {"A": 1}}}}
    )

    assert recipe.proposal.params["argv"] == ("python", "p.py")
    with pytest.raises(TypeError):
        recipe.proposal.params["argv"] = ()  # type: ignore[index]
    assert recipe_to_dict(recipe)["proposal"] == {
        "operator": "command",
        "params": {"argv": ["python", "p.py"], "env": {"A": 1}},
    }


def test_base_preset_is_merged_under_the_recipe() -> None:
    recipe = parse_recipe(
        """
        base: rrsi
        name: mine
        rounds: 20
        proposal: {operator: command, params: {argv: [python, propose.py]}}
        admissibility: {c1: 0.1}
        """
    )
    rrsi = recipe_to_dict(load_preset("rrsi"))
    expected = {
        **rrsi,
        "name": "mine",
        "description": "",
        "rounds": 20,
        "proposal": {"operator": "command", "params": {"argv": ["python", "propose.py"]}},
        "admissibility": {**rrsi["admissibility"], "c1": 0.1},
        "edit_budget": {**rrsi["edit_budget"], "T": 20},
    }

    assert recipe_to_dict(recipe) == expected


def test_base_needs_a_known_preset_and_a_name() -> None:
    with raises_at("base", "unknown preset 'rrs'"):
        parse_recipe({"base": "rrs", "name": "x"})
    with raises_at("name", "required"):
        parse_recipe({"base": "rrsi"})


def test_gate_params_resolve_the_score_unit() -> None:
    params = gate_params(load_preset("rrsi"), evolve_trials=178)

    assert params == GateParams(score_unit=1 / 178)
    workspace = parse_recipe({"name": "w", "admissibility": {"score_unit": "criterion", "score_unit_size": 100}})
    assert gate_params(workspace, evolve_criteria=14100).score_unit == 100 / 14100
    with pytest.raises(ValueError, match="^evolve_criteria must be a positive count, got None$"):
        gate_params(workspace, evolve_trials=178)


def test_gate_params_carry_the_switches() -> None:
    params = gate_params(load_preset("archive"), evolve_trials=10)

    assert (params.noise_band, params.admissibility) == (False, False)


# --- Errors name the key ------------------------------------------------------------------------


def test_unknown_key_error_names_the_path() -> None:
    with raises_at("admissibility.c2", "unknown key (allowed: enabled, c0, c1, "):
        parse_recipe({"name": "x", "admissibility": {"c2": 0.1}})
    with raises_at("roundz", "unknown key (allowed: name, version, "):
        parse_recipe({"name": "x", "roundz": 3})
    with raises_at("evaluation.minibatch.sise", "unknown key"):
        parse_recipe({"name": "x", "evaluation": {"minibatch": {"sise": 3}}})


def test_error_carries_the_path_attribute() -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe({"name": "x", "admissibility": {"c1": -0.1}})

    assert info.value.path == "admissibility.c1"
    assert str(info.value) == "admissibility.c1: must be >= 0, got -0.1"


@pytest.mark.parametrize(
    ("document", "path", "message"),
    [
        pytest.param({"admissibility": {"c1": -0.1}}, "admissibility.c1", "must be >= 0, got -0.1", id="c1"),
        pytest.param(
            {"edit_budget": {"k_max": 2, "k_min": 3}},
            "edit_budget.k_min",
            "must be <= edit_budget.k_max (2), got 3",
            id="k_min>k_max",
        ),
        pytest.param({"stall": {"w": 0}}, "stall.w", "must be >= 1, got 0", id="w"),
        pytest.param(
            {"stall": {"m_draft": 5}}, "stall.m_draft", "must be <= candidates_per_round (4), got 5", id="m_draft"
        ),
        pytest.param(
            {"critique": {"leakage_policy": "ask"}},
            "critique.leakage_policy",
            "must be one of reject, review, off, got 'ask'",
            id="policy",
        ),
        pytest.param(
            {"evaluation": {"evolve_splits": ["train", "dev"]}},
            "evaluation.evolve_splits",
            "unknown split 'dev' (allowed: train, gate)",
            id="unknown-split",
        ),
        pytest.param(
            {"evaluation": {"evolve_splits": ["gate", "sealed"]}},
            "evaluation.evolve_splits",
            "'sealed' is never used for selection (its results are only reported)",
            id="sealed-split",
        ),
        pytest.param(
            {"evaluation": {"evolve_splits": []}},
            "evaluation.evolve_splits",
            "must be a non-empty list of splits, got []",
            id="no-split",
        ),
        pytest.param(
            {"evaluation": {"sealed": "weekly"}},
            "evaluation.sealed",
            "must be one of every_round, final, never, got 'weekly'",
            id="sealed-schedule",
        ),
        pytest.param(
            {"evaluation": {"minibatch": {"required_rate": 1.5}}},
            "evaluation.minibatch.required_rate",
            "must be <= 1, got 1.5",
            id="minibatch-rate",
        ),
        pytest.param({"rounds": 0}, "rounds", "must be >= 1, got 0", id="rounds"),
        pytest.param({"rounds": True}, "rounds", "must be an integer, got True", id="bool-is-not-int"),
        pytest.param({"evaluation": {"trials_per_task": 0}}, "evaluation.trials_per_task", "must be >= 1", id="k"),
        pytest.param(
            {"admissibility": {"c1": "1e-3"}},
            "admissibility.c1",
            "must be a finite number, got '1e-3' (YAML reads 1e-3 as text: write 1.0e-3)",
            id="yaml-exponent",
        ),
        pytest.param(
            {"admissibility": {"score_unit_size": 0}}, "admissibility.score_unit_size", "must be > 0", id="unit"
        ),
        pytest.param(
            {"admissibility": {"valid_output_drop": -0.03}},
            "admissibility.valid_output_drop",
            "must be >= 0",
            id="guard",
        ),
        pytest.param(
            {"admissibility": {"lambda_N": -1}}, "admissibility.lambda_N", "must be >= 0, got -1", id="lambda"
        ),
        pytest.param(
            {"noise": {"rule": "fixed"}},
            "noise.fixed",
            "required when noise.rule is 'fixed'",
            id="fixed-missing",
        ),
        pytest.param(
            {"noise": {"fixed": 0.02}}, "noise.fixed", "only used when noise.rule is 'fixed'", id="fixed-stray"
        ),
        pytest.param(
            {"noise": {"repeats": 1}}, "noise.repeats", "must be >= 2 for noise.rule 'bootstrap'", id="repeats"
        ),
        pytest.param({"noise": {"floor": "train"}}, "noise.floor", "must be one of evolve, gate", id="floor"),
        pytest.param(
            {"noise": {"floor": "gate"}, "evaluation": {"evolve_splits": ["train"]}},
            "noise.floor",
            "'gate' needs the gate split among evaluation.evolve_splits",
            id="floor-gate-not-evolved",
        ),
        pytest.param(
            {"noise": {"rule": "iqr"}}, "noise.rule", "must be one of bootstrap, range, std, fixed", id="noise-rule"
        ),
        pytest.param(
            {"critique": {"enabled": True, "operator": "none"}},
            "critique.operator",
            "'none' runs nothing; set critique.enabled: false instead",
            id="critic-none-enabled",
        ),
        pytest.param(
            {"gate": {"operator": "unregularized"}},
            "gate.operator",
            "the unregularized gate uses neither the noise band nor admissibility; "
            "set noise.enabled and admissibility.enabled to false",
            id="unregularized-with-filters",
        ),
        pytest.param({"gate": {"accept": "all"}}, "gate.accept", "must be one of chosen, admissible", id="accept"),
        pytest.param({"proposal": {"params": ["argv"]}}, "proposal.params", "must be a mapping", id="params-list"),
        pytest.param(
            {"proposal": {"params": {"when": float("nan")}}},
            "proposal.params.when",
            "must be a finite number",
            id="params-nan",
        ),
        pytest.param({"ledger": None}, "ledger", "must be a mapping, got None", id="null-block"),
        pytest.param({"limits": {"max_tokens": 0}}, "limits.max_tokens", "must be >= 1, got 0", id="limits"),
        pytest.param({"name": " "}, "name", "must not be empty", id="blank-name"),
    ],
)
def test_out_of_range_values_name_the_key(document: dict[str, Any], path: str, message: str) -> None:
    with raises_at(path, message):
        parse_recipe({"name": "x", **document})


def test_yaml_params_must_be_json_data() -> None:
    with raises_at("proposal.params.since", "must be JSON data"):
        parse_recipe("name: x\nproposal: {operator: llm, params: {since: 2024-01-01}}\n")


def test_missing_name_is_an_error() -> None:
    with raises_at("name", "required"):
        parse_recipe({"rounds": 3})


def test_duplicate_keys_are_errors_in_yaml_and_json() -> None:
    with pytest.raises(RecipeError, match="^recipe is not valid YAML: .*duplicate key 'c1'"):
        parse_recipe("name: x\nadmissibility:\n  c1: 0.25\n  c1: 0.5\n")
    with pytest.raises(RecipeError, match="^recipe is not valid JSON: duplicate key 'rounds'"):
        parse_recipe('{"name": "x", "rounds": 3, "rounds": 4}')


def test_a_document_that_is_not_a_mapping_is_an_error() -> None:
    with pytest.raises(RecipeError, match="^a recipe must be a mapping of keys to values$"):
        parse_recipe("- rrsi\n")


def test_known_operators_are_checked_per_stage() -> None:
    registry = {"proposal": {"example", "command"}, "critique": {"rules"}}

    with raises_at("proposal.operator", "unknown proposal operator 'llm' (known: command, example)"):
        parse_recipe({"name": "x"}, known_operators=registry)
    # "none" always switches critique off; stages missing from the registry are not checked.
    recipe = parse_recipe(
        {"name": "x", "proposal": {"operator": "example"}, "critique": {"operator": "none"}, "gate": {}},
        known_operators=registry,
    )
    assert (recipe.proposal.operator, recipe.critique.operator) == ("example", "none")


def test_without_a_registry_any_operator_name_is_accepted() -> None:
    recipe = parse_recipe({"name": "x", "proposal": {"operator": "my_proposer"}})

    assert recipe.proposal.operator == "my_proposer"
