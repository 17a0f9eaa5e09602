"""Recipes: declarative, versioned descriptions of one method (docs/concepts.md, sections 1, 4, 5).

Pure functions and frozen dataclasses, no ORM. A recipe is a YAML or JSON
document; ``parse_recipe`` validates it and fills every default, and
``recipe_to_dict`` gives the normalized form, so two recipes that mean the
same thing give equal dicts and equal ``recipe_digest``. docs/recipes.md
describes every key; the presets in ``recipe_presets/`` are examples.

Rules of the document:

- Unknown keys, wrong types and out-of-range values are ``RecipeError``
  naming the key path, e.g. ``admissibility.c1: must be >= 0, got -0.1``.
  Duplicate keys are errors too (a second ``c1:`` would silently win).
- ``null`` is accepted only where it means something (``edit_budget.T``,
  ``noise.fixed``, the two guards, the two limits); elsewhere leave the key
  out to get its default.
- Every default is the value of the ``rrsi`` preset, so a recipe only lists
  what it changes. ``base: <preset>`` starts from a preset instead: its
  blocks are merged key by key with the recipe's (a ``params`` mapping given
  in the recipe replaces the preset's whole); ``name``, ``version`` and
  ``description`` are never inherited.
- Each regularization switch (docs/concepts.md, section 4) is a block with
  ``enabled``: ``edit_budget`` (A), ``ledger`` (B), ``stall`` (C), ``critique`` (D),
  ``noise`` (E), ``admissibility`` (F, with the guards), ``pruning`` (G). A
  disabled block's other values are still validated and kept, except that a
  disabled ``critique`` or ``pruning`` normalizes to the ``none`` operator
  (and the ``off`` leakage policy): a disabled critic has nothing to run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import yaml

from evolution import limits
from evolution.digests import json_digest
from evolution.loop.measure import SCORE_METRICS
from evolution.loop.regularization import NOISE_RULES, SCORE_UNITS, GateParams, score_unit_size

if TYPE_CHECKING:
    from evolution.models import Run

__all__ = [
    "BUILTIN_OPERATORS",
    "LEAKAGE_POLICIES",
    "PRESET_DIR",
    "PRESET_NAMES",
    "SEALED_SCHEDULES",
    "AdmissibilitySpec",
    "CritiqueSpec",
    "EditBudgetSpec",
    "EvaluationSpec",
    "GateSpec",
    "LedgerSpec",
    "LimitsSpec",
    "MinibatchSpec",
    "NoiseSpec",
    "PruningSpec",
    "Recipe",
    "RecipeError",
    "StageSpec",
    "StallSpec",
    "gate_params",
    "load_preset",
    "parse_recipe",
    "recipe_digest",
    "recipe_to_dict",
    "run_recipe",
]

PRESET_DIR = Path(__file__).with_name("recipe_presets")
PRESET_NAMES: tuple[str, ...] = (
    "rrsi",
    "unregularized",
    "rrsi-no-selection",
    "rrsi-no-proposal",
    "pareto",
    "archive",
)

# The operators this codebase knows of; the loop passes its registry to
# parse_recipe, which may differ. "none" switches critique or pruning off.
BUILTIN_OPERATORS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "parent_selection": frozenset({"best", "latest_accepted", "pareto", "archive"}),
        "proposal": frozenset({"example", "command", "llm"}),
        "critique": frozenset({"rules", "llm", "none"}),
        "gate": frozenset({"regularized", "unregularized"}),
        "pruning": frozenset({"window", "none"}),
    }
)
NO_OPERATOR = "none"

LEAKAGE_POLICIES: tuple[str, ...] = ("reject", "review", "off")
SEALED_SCHEDULES: tuple[str, ...] = ("every_round", "final", "never")
EVOLVE_SPLIT_CHOICES: tuple[str, ...] = ("train", "gate")
REPORT_ONLY_SPLITS: tuple[str, ...] = ("sealed", "heldout")
GATE_ACCEPT: tuple[str, ...] = ("chosen", "admissible")
NAME_MAX_LENGTH = 100  # evolution.models.Recipe.name
# Trial error kinds that are the platform's failure, not the harness's: the grader or the sandbox failed. An agent
# that crashes, times out or floods its output failed the task (a score of 0 is right for it).
INFRA_ERROR_KINDS: tuple[str, ...] = ("sandbox", "infra", "verifier_timeout", "verifier_crash", "verifier_output")


class RecipeError(ValueError):
    """The recipe is not valid. ``path`` is the dotted key path at fault
    (empty for the document as a whole); the message starts with it."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


# --- The recipe --------------------------------------------------------------------
# Field names are the document's keys, so recipe_to_dict is a plain walk.


@dataclass(frozen=True)
class StageSpec:
    """A stage filled by a named operator; ``params`` is free JSON data for it
    (read-only: nested mappings are read-only views, lists are tuples)."""

    operator: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class CritiqueSpec:
    """Switch D. ``leakage_policy``: ``reject`` flagged candidates, hold them
    for a human (``review``), or ``off`` (flags recorded, nothing held)."""

    enabled: bool
    operator: str
    leakage_policy: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class MinibatchSpec:
    """Validate on ``size`` train tasks first; evaluate fully only when the
    pass rate there is at least ``required_rate``."""

    enabled: bool
    size: int
    required_rate: float


@dataclass(frozen=True)
class EvaluationSpec:
    """``trials_per_task`` is k; S is ``score_metric`` over ``evolve_splits``;
    ``sealed`` says when sealed and held-out tasks run (reported only);
    ``max_infra_error_rate`` is the share of an evaluation's trials that may
    end in infrastructure errors (``INFRA_ERROR_KINDS``) before it is refused
    certification: failures of the platform are never scores."""

    trials_per_task: int
    evolve_splits: tuple[str, ...]
    score_metric: str
    sealed: str
    minibatch: MinibatchSpec
    max_infra_error_rate: float = 0.1


@dataclass(frozen=True)
class GateSpec:
    """``accept``: ``chosen`` accepts only the candidate ``choose`` picks (one
    lineage); ``admissible`` accepts every admissible candidate into the
    archive of parents, and the chosen one becomes the current harness."""

    operator: str
    accept: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class EditBudgetSpec:
    """Switch A: k_t decays by cosine from k_max to k_min over T rounds."""

    enabled: bool
    k_max: int
    k_min: int
    T: int


@dataclass(frozen=True)
class LedgerSpec:
    """Switch B: whether the proposer reads the ledger. The ledger is recorded
    either way (stall and pruning read it)."""

    enabled: bool


@dataclass(frozen=True)
class StallSpec:
    """Switch C: stalled when S_best rose by at most delta over w rounds; then
    m_draft candidates per round must touch never-measured component kinds."""

    enabled: bool
    w: int
    m_draft: int


@dataclass(frozen=True)
class NoiseSpec:
    """Switch E (band and floor in the gate). delta comes from ``repeats``
    evaluations of the seed, each with ``trials_per_task`` trials of every
    task (at least the evaluation's k), by ``rule``, or is ``fixed`` (a
    fraction of S)."""

    enabled: bool
    repeats: int
    rule: str
    fixed: float | None
    trials_per_task: int = 2
    floor: str = "evolve"  # S on the evolve splits (the seed text) or on the gate split alone (RSIHub)


@dataclass(frozen=True)
class AdmissibilitySpec:
    """Switch F: the cost rule, the inside-noise objective and the guards.

    c1 is the allowed relative cost rise per ``score_unit_size`` x
    ``score_unit`` of dS (published coding: 0.25 per 1 trial).
    """

    enabled: bool
    c0: float
    c1: float
    score_unit: str
    score_unit_size: float
    lambda_S: float  # names as in docs/concepts.md
    lambda_C: float
    lambda_N: float
    valid_output_drop: float | None
    no_submission_rise: float | None


@dataclass(frozen=True)
class PruningSpec:
    """Switch G: components whose best dS over the last ``window`` rounds is
    not above ``threshold`` are handed to the proposer as deletion targets."""

    enabled: bool
    operator: str
    window: int
    threshold: float
    params: Mapping[str, Any]


@dataclass(frozen=True)
class LimitsSpec:
    """Optional run budgets; the run stops when one is spent. None: no limit."""

    max_tokens: int | None
    max_wall_seconds: int | None


@dataclass(frozen=True)
class Recipe:
    name: str
    version: int
    description: str
    rounds: int
    candidates_per_round: int
    seed: int
    parent_selection: StageSpec
    proposal: StageSpec
    critique: CritiqueSpec
    evaluation: EvaluationSpec
    gate: GateSpec
    edit_budget: EditBudgetSpec
    ledger: LedgerSpec
    stall: StallSpec
    noise: NoiseSpec
    admissibility: AdmissibilitySpec
    pruning: PruningSpec
    limits: LimitsSpec

    @property
    def needs_noise_estimate(self) -> bool:
        """Whether the seed must be evaluated ``noise.repeats`` times: the
        band (E) and the stall detector (C) both use delta."""
        return self.noise.enabled or self.stall.enabled

    @property
    def baseline_repeats(self) -> int:
        """Evaluations of the seed before the first round."""
        return self.noise.repeats if self.needs_noise_estimate else 1

    @property
    def noise_k(self) -> int:
        """Trials per task in each repeat of the seed after its first (``noise.trials_per_task``, at least the
        evaluation's k). The first is an evaluation like every candidate's (k trials), so the seed's
        reported numbers compare with theirs; the repeats add trials to what delta is estimated from."""
        return max(self.evaluation.trials_per_task, self.noise.trials_per_task)

    def baseline_trials_per_task(self) -> int:
        """Trials per task of all the seed's evaluations before the first round."""
        return self.evaluation.trials_per_task + (self.baseline_repeats - 1) * self.noise_k


# --- Public functions ---------------------------------------------------------------


def parse_recipe(
    source: str | bytes | Mapping[str, Any],
    *,
    known_operators: Mapping[str, AbstractSet[str]] | None = None,
) -> Recipe:
    """Validate a recipe given as YAML or JSON text, or as a loaded mapping.

    Text whose first non-blank character is ``{`` is read as JSON, anything
    else as YAML (safe loading: plain data only). ``known_operators`` maps a
    stage name (``parent_selection``, ``proposal``, ``critique``, ``gate``,
    ``pruning``) to the operator names the loop can run; a stage missing
    from it, or ``known_operators=None``, is not checked (``none`` is always
    allowed for critique and pruning). Raises ``RecipeError`` naming the key.
    """
    data = _load(source) if isinstance(source, str | bytes) else source
    if not isinstance(data, Mapping):
        raise RecipeError("", "a recipe must be a mapping of keys to values")
    return _parse(_resolve_base(data, ()), known_operators)


def run_recipe(run: Run) -> Recipe:
    """The recipe ``run`` follows: its stored spec, checked against every registered operator. A read of the
    run's row (no query beyond ``run.recipe``), so services and the loop alike may call it."""
    from evolution.operators import known_operators

    return parse_recipe(run.recipe.spec, known_operators=known_operators())


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    """The normalized plain form (every default filled, lists not tuples):
    equal recipes give equal dicts, and ``parse_recipe`` of it gives the
    recipe back."""
    plain = _to_plain(recipe)
    assert isinstance(plain, dict)
    return plain


def recipe_digest(recipe: Recipe) -> str:
    """SHA-256 of the RFC 8785 form of ``recipe_to_dict``: independent of key
    order and of how the document spelled its defaults."""
    return json_digest(recipe_to_dict(recipe))


def load_preset(name: str) -> Recipe:
    """The preset recipe ``name`` (one of ``PRESET_NAMES``). Raises
    ``RecipeError`` for an unknown name."""
    return parse_recipe(_preset_mapping(name, ""))


def gate_params(recipe: Recipe, *, evolve_trials: int | None = None, evolve_criteria: int | None = None) -> GateParams:
    """The regularized gate's parameters for this recipe and evolve set.

    ``evolve_trials`` (tasks x k in the evolve splits) is needed when
    ``admissibility.score_unit`` is ``trial``, ``evolve_criteria`` (criterion
    judgments in the evolve splits) when it is ``criterion``. Raises
    ``ValueError`` when the one needed is missing.
    """
    spec = recipe.admissibility
    unit = score_unit_size(
        spec.score_unit, spec.score_unit_size, evolve_trials=evolve_trials, evolve_criteria=evolve_criteria
    )
    return GateParams(
        score_unit=unit,
        noise_band=recipe.noise.enabled,
        admissibility=spec.enabled,
        c0=spec.c0,
        c1=spec.c1,
        lambda_S=spec.lambda_S,
        lambda_C=spec.lambda_C,
        lambda_N=spec.lambda_N,
        valid_output_drop=spec.valid_output_drop,
        no_submission_rise=spec.no_submission_rise,
    )


# --- Loading text and presets --------------------------------------------------------


def _load(source: str | bytes) -> Any:
    """Recipe text as data, within the input limits (size, depth, and YAML
    aliases that may not expand past ``RSI_MAX_YAML_NODES``): a recipe is
    frozen as its expanded form, so a "billion laughs" one never finished."""
    try:
        limits.check_size(source, setting="RSI_MAX_RECIPE_BYTES", what="recipe")
        try:
            text = source.decode("utf-8") if isinstance(source, bytes) else source
        except UnicodeDecodeError as exc:
            raise RecipeError("", f"recipe is not UTF-8 text: {exc}") from exc
        if text.lstrip().startswith("{"):
            try:
                return limits.json_loads(text, what="recipe", object_pairs_hook=_unique_pairs)
            except limits.InputLimitError:
                raise
            except ValueError as exc:  # JSONDecodeError and our duplicate-key error
                raise RecipeError("", f"recipe is not valid JSON: {exc}") from exc
        try:
            return limits.yaml_load(text, loader=_UniqueKeyLoader, setting="RSI_MAX_RECIPE_BYTES", what="recipe")
        except yaml.YAMLError as exc:
            raise RecipeError("", f"recipe is not valid YAML: {exc}") from exc
    except limits.InputLimitError as exc:
        raise RecipeError("", str(exc)) from exc


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


class _UniqueKeyLoader(limits.LimitedSafeLoader):
    """SafeLoader (within the input limits) that refuses a key written twice in one mapping."""


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, str) and key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        if isinstance(key, str):
            seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _preset_mapping(name: Any, path: str) -> Mapping[str, Any]:
    if name not in PRESET_NAMES:
        raise RecipeError(path, f"unknown preset {name!r} (known: {', '.join(PRESET_NAMES)})")
    data = _load((PRESET_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    if not isinstance(data, Mapping):
        raise RecipeError(path, f"preset {name!r} is not a mapping")
    return data


_IDENTITY_KEYS = ("name", "version", "description")


def _resolve_base(data: Mapping[str, Any], seen: tuple[str, ...]) -> Mapping[str, Any]:
    """Merge ``data`` over its ``base`` preset (recursively); identity keys
    are not inherited."""
    if "base" not in data:
        return data
    base_name = data["base"]
    if base_name in seen:
        raise RecipeError("base", f"presets refer to each other in a cycle: {' -> '.join([*seen, base_name])}")
    base = _resolve_base(_preset_mapping(base_name, "base"), (*seen, base_name))
    inherited = {key: value for key, value in base.items() if key not in _IDENTITY_KEYS}
    own = {key: value for key, value in data.items() if key != "base"}
    return _merge(inherited, own)


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        # params belong to one operator: merging them would keep stale keys
        # when the recipe changes the operator.
        if key != "params" and isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# --- Validation ------------------------------------------------------------------------


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Block:
    """One mapping of the document at ``path``, with typed readers. Unknown
    keys are reported first, so a typo is not hidden behind another error."""

    def __init__(self, data: Any, path: str, keys: tuple[str, ...]) -> None:
        if not isinstance(data, Mapping):
            raise RecipeError(path, f"must be a mapping, got {_shown(data)}")
        for key in data:
            if key not in keys:
                raise RecipeError(_join(path, str(key)), f"unknown key (allowed: {', '.join(keys)})")
        self.data = data
        self.path = path

    def where(self, key: str) -> str:
        return _join(self.path, key)

    def block(self, key: str, keys: tuple[str, ...]) -> _Block:
        return _Block(self.data.get(key, {}), self.where(key), keys)

    def text(self, key: str, default: str | None = None, *, max_length: int | None = None) -> str:
        if key not in self.data:
            if default is None:
                raise RecipeError(self.where(key), "required")
            return default
        value = self.data[key]
        if not isinstance(value, str):
            raise RecipeError(self.where(key), f"must be a string, got {_shown(value)}")
        if max_length is not None and len(value) > max_length:
            raise RecipeError(self.where(key), f"must be at most {max_length} characters")
        return value

    def name(self, key: str, default: str | None = None) -> str:
        value = self.text(key, default, max_length=NAME_MAX_LENGTH)
        if not value.strip():
            raise RecipeError(self.where(key), "must not be empty")
        return value

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.data.get(key, default)
        if value not in choices:
            raise RecipeError(self.where(key), f"must be one of {', '.join(choices)}, got {_shown(value)}")
        return str(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise RecipeError(self.where(key), f"must be true or false, got {_shown(value)}")
        return value

    def integer(self, key: str, default: int | None, *, minimum: int | None = None, nullable: bool = False) -> Any:
        value = self.data.get(key, default)
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecipeError(self.where(key), f"must be an integer, got {_shown(value)}")
        if minimum is not None and value < minimum:
            raise RecipeError(self.where(key), f"must be >= {minimum}, got {value}")
        return value

    def number(
        self,
        key: str,
        default: float | None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        positive: bool = False,
        nullable: bool = False,
    ) -> Any:
        value = self.data.get(key, default)
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            hint = " (YAML reads 1e-3 as text: write 1.0e-3)" if isinstance(value, str) else ""
            raise RecipeError(self.where(key), f"must be a finite number, got {_shown(value)}{hint}")
        if positive and value <= 0:
            raise RecipeError(self.where(key), f"must be > 0, got {value:g}")
        if minimum is not None and value < minimum:
            raise RecipeError(self.where(key), f"must be >= {minimum:g}, got {value:g}")
        if maximum is not None and value > maximum:
            raise RecipeError(self.where(key), f"must be <= {maximum:g}, got {value:g}")
        return float(value)

    def params(self) -> Mapping[str, Any]:
        value = self.data.get("params", {})
        if not isinstance(value, Mapping):
            raise RecipeError(self.where("params"), f"must be a mapping, got {_shown(value)}")
        frozen = _freeze(value, self.where("params"))
        assert isinstance(frozen, Mapping)
        return frozen


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _freeze(value: Any, path: str) -> Any:
    """Validate JSON data and make it read-only (mappings -> read-only views,
    lists -> tuples), so a frozen Recipe cannot be changed through params."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RecipeError(path, f"must be a finite number, got {value!r}")
        return value
    if isinstance(value, Mapping):
        frozen: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise RecipeError(path, f"keys must be strings, got {_shown(key)}")
            frozen[key] = _freeze(item, _join(path, key))
        return MappingProxyType(frozen)
    if isinstance(value, list | tuple):
        return tuple(_freeze(item, f"{path}[{index}]") for index, item in enumerate(value))
    raise RecipeError(path, f"must be JSON data (string, number, boolean, null, list, mapping), got {_shown(value)}")


def _to_plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {item.name: _to_plain(getattr(value, item.name)) for item in fields(value)}
    if isinstance(value, Mapping):
        return {key: _to_plain(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [_to_plain(item) for item in value]
    return value


_TOP_KEYS = (
    "name",
    "version",
    "description",
    "rounds",
    "candidates_per_round",
    "seed",
    "parent_selection",
    "proposal",
    "critique",
    "evaluation",
    "gate",
    "edit_budget",
    "ledger",
    "stall",
    "noise",
    "admissibility",
    "pruning",
    "limits",
)
_STAGE_KEYS = ("operator", "params")


class _Operators:
    def __init__(self, known: Mapping[str, AbstractSet[str]] | None) -> None:
        self.known = known

    def read(self, block: _Block, stage: str, default: str) -> str:
        value = block.name("operator", default)
        if self.known is None or stage not in self.known:
            return value
        allowed = set(self.known[stage])
        if stage in ("critique", "pruning"):
            allowed.add(NO_OPERATOR)
        if value not in allowed:
            raise RecipeError(
                block.where("operator"), f"unknown {stage} operator {value!r} (known: {', '.join(sorted(allowed))})"
            )
        return value


def _parse(data: Mapping[str, Any], known: Mapping[str, AbstractSet[str]] | None) -> Recipe:
    top = _Block(data, "", _TOP_KEYS)
    operators = _Operators(known)
    rounds = top.integer("rounds", 10, minimum=1)
    candidates_per_round = top.integer("candidates_per_round", 4, minimum=1)

    parent_block = top.block("parent_selection", _STAGE_KEYS)
    proposal_block = top.block("proposal", _STAGE_KEYS)
    recipe = Recipe(
        name=top.name("name"),
        version=top.integer("version", 1, minimum=1),
        description=top.text("description", ""),
        rounds=rounds,
        candidates_per_round=candidates_per_round,
        seed=top.integer("seed", 0, minimum=0),
        parent_selection=StageSpec(
            operator=operators.read(parent_block, "parent_selection", "latest_accepted"),
            params=parent_block.params(),
        ),
        proposal=StageSpec(operator=operators.read(proposal_block, "proposal", "llm"), params=proposal_block.params()),
        critique=_critique(top, operators),
        evaluation=_evaluation(top),
        gate=_gate(top, operators),
        edit_budget=_edit_budget(top, rounds),
        ledger=LedgerSpec(enabled=top.block("ledger", ("enabled",)).flag("enabled", True)),
        stall=_stall(top, candidates_per_round),
        noise=_noise(top),
        admissibility=_admissibility(top),
        pruning=_pruning(top, operators),
        limits=_limits(top),
    )
    if recipe.gate.operator == "unregularized":
        on = [name for name, spec in (("noise", recipe.noise), ("admissibility", recipe.admissibility)) if spec.enabled]
        if on:
            raise RecipeError(
                "gate.operator",
                "the unregularized gate uses neither the noise band nor admissibility; "
                f"set {' and '.join(f'{name}.enabled' for name in on)} to false",
            )
    if recipe.noise.floor == "gate" and "gate" not in recipe.evaluation.evolve_splits:
        raise RecipeError("noise.floor", "'gate' needs the gate split among evaluation.evolve_splits")
    return recipe


def _switch_operator(block: _Block, operators: _Operators, stage: str, default: str) -> tuple[bool, str]:
    """``enabled`` and ``operator`` of a switch whose off state is the ``none``
    operator. ``operator: none`` alone switches it off; ``enabled: false``
    wins over an operator written or inherited from a base (the operator is
    still validated, then normalized to ``none``), so every off state has one
    normalized form. ``enabled: true`` with ``operator: none`` is an error."""
    enabled = block.flag("enabled", block.data.get("operator") != NO_OPERATOR)
    operator = operators.read(block, stage, default if enabled else NO_OPERATOR)
    if enabled and operator == NO_OPERATOR:
        raise RecipeError(block.where("operator"), f"'none' runs nothing; set {block.where('enabled')}: false instead")
    return enabled, operator if enabled else NO_OPERATOR


def _critique(top: _Block, operators: _Operators) -> CritiqueSpec:
    block = top.block("critique", ("enabled", "operator", "leakage_policy", "params"))
    enabled, operator = _switch_operator(block, operators, "critique", "rules")
    policy = block.choice("leakage_policy", "review", LEAKAGE_POLICIES)
    # A critic that does not run flags nothing, whatever the policy says.
    return CritiqueSpec(
        enabled=enabled, operator=operator, leakage_policy=policy if enabled else "off", params=block.params()
    )


def _evaluation(top: _Block) -> EvaluationSpec:
    block = top.block(
        "evaluation",
        ("trials_per_task", "evolve_splits", "score_metric", "sealed", "minibatch", "max_infra_error_rate"),
    )
    raw_splits = block.data.get("evolve_splits", list(EVOLVE_SPLIT_CHOICES))
    where = block.where("evolve_splits")
    if not isinstance(raw_splits, list | tuple) or not raw_splits:
        raise RecipeError(where, f"must be a non-empty list of splits, got {_shown(raw_splits)}")
    for split in raw_splits:
        if split in REPORT_ONLY_SPLITS:
            raise RecipeError(where, f"{split!r} is never used for selection (its results are only reported)")
        if split not in EVOLVE_SPLIT_CHOICES:
            raise RecipeError(where, f"unknown split {_shown(split)} (allowed: {', '.join(EVOLVE_SPLIT_CHOICES)})")
    if len(set(raw_splits)) != len(raw_splits):
        raise RecipeError(where, "lists a split twice")
    minibatch = block.block("minibatch", ("enabled", "size", "required_rate"))
    return EvaluationSpec(
        trials_per_task=block.integer("trials_per_task", 2, minimum=1),
        # Canonical order, so [gate, train] and [train, gate] give one digest.
        evolve_splits=tuple(split for split in EVOLVE_SPLIT_CHOICES if split in raw_splits),
        score_metric=block.choice("score_metric", "pass_at_1", SCORE_METRICS),
        sealed=block.choice("sealed", "final", SEALED_SCHEDULES),
        minibatch=MinibatchSpec(
            enabled=minibatch.flag("enabled", False),
            size=minibatch.integer("size", 8, minimum=1),
            required_rate=minibatch.number("required_rate", 0.5, minimum=0.0, maximum=1.0),
        ),
        max_infra_error_rate=block.number("max_infra_error_rate", 0.1, minimum=0.0, maximum=1.0),
    )


def _gate(top: _Block, operators: _Operators) -> GateSpec:
    block = top.block("gate", ("operator", "accept", "params"))
    return GateSpec(
        operator=operators.read(block, "gate", "regularized"),
        accept=block.choice("accept", "chosen", GATE_ACCEPT),
        params=block.params(),
    )


def _edit_budget(top: _Block, rounds: int) -> EditBudgetSpec:
    block = top.block("edit_budget", ("enabled", "k_max", "k_min", "T"))
    k_max = block.integer("k_max", 4, minimum=1)
    k_min = block.integer("k_min", 1, minimum=1)
    if k_min > k_max:
        raise RecipeError(block.where("k_min"), f"must be <= edit_budget.k_max ({k_max}), got {k_min}")
    T = block.integer("T", None, minimum=1, nullable=True)
    # T defaults to the number of rounds; stored filled in, so writing T: 10
    # or leaving it out with rounds: 10 is the same recipe.
    return EditBudgetSpec(enabled=block.flag("enabled", True), k_max=k_max, k_min=k_min, T=rounds if T is None else T)


def _stall(top: _Block, candidates_per_round: int) -> StallSpec:
    block = top.block("stall", ("enabled", "w", "m_draft"))
    m_draft = block.integer("m_draft", 1, minimum=0)
    if m_draft > candidates_per_round:
        raise RecipeError(
            block.where("m_draft"), f"must be <= candidates_per_round ({candidates_per_round}), got {m_draft}"
        )
    return StallSpec(enabled=block.flag("enabled", True), w=block.integer("w", 3, minimum=1), m_draft=m_draft)


NOISE_FLOORS = ("evolve", "gate")


def _noise(top: _Block) -> NoiseSpec:
    block = top.block("noise", ("enabled", "repeats", "rule", "fixed", "trials_per_task", "floor"))
    floor = block.choice("floor", "evolve", NOISE_FLOORS)
    rule = block.choice("rule", "bootstrap", NOISE_RULES)
    fixed = block.number("fixed", None, minimum=0.0, maximum=1.0, nullable=True)
    repeats = block.integer("repeats", 3, minimum=1)
    trials_per_task = block.integer("trials_per_task", 2, minimum=1)
    if rule == "fixed" and fixed is None:
        raise RecipeError(block.where("fixed"), "required when noise.rule is 'fixed' (delta as a fraction of S)")
    if rule != "fixed" and fixed is not None:
        raise RecipeError(block.where("fixed"), f"only used when noise.rule is 'fixed', not {rule!r}")
    if rule != "fixed" and repeats < 2:
        raise RecipeError(block.where("repeats"), f"must be >= 2 for noise.rule {rule!r}, got {repeats}")
    return NoiseSpec(
        enabled=block.flag("enabled", True),
        repeats=repeats,
        rule=rule,
        fixed=fixed,
        trials_per_task=trials_per_task,
        floor=floor,
    )


def _admissibility(top: _Block) -> AdmissibilitySpec:
    block = top.block(
        "admissibility",
        (
            "enabled",
            "c0",
            "c1",
            "score_unit",
            "score_unit_size",
            "lambda_S",
            "lambda_C",
            "lambda_N",
            "valid_output_drop",
            "no_submission_rise",
        ),
    )
    return AdmissibilitySpec(
        enabled=block.flag("enabled", True),
        c0=block.number("c0", 0.0),
        c1=block.number("c1", 0.25, minimum=0.0),
        score_unit=block.choice("score_unit", "trial", SCORE_UNITS),
        score_unit_size=block.number("score_unit_size", 1.0, positive=True),
        lambda_S=block.number("lambda_S", 0.0, minimum=0.0),
        lambda_C=block.number("lambda_C", 1.0, minimum=0.0),
        lambda_N=block.number("lambda_N", 0.25, minimum=0.0),
        valid_output_drop=block.number("valid_output_drop", 0.03, minimum=0.0, maximum=1.0, nullable=True),
        no_submission_rise=block.number("no_submission_rise", 0.02, minimum=0.0, maximum=1.0, nullable=True),
    )


def _pruning(top: _Block, operators: _Operators) -> PruningSpec:
    block = top.block("pruning", ("enabled", "operator", "window", "threshold", "params"))
    enabled, operator = _switch_operator(block, operators, "pruning", "window")
    return PruningSpec(
        enabled=enabled,
        operator=operator,
        window=block.integer("window", 3, minimum=1),
        threshold=block.number("threshold", 0.0),
        params=block.params(),
    )


def _limits(top: _Block) -> LimitsSpec:
    block = top.block("limits", ("max_tokens", "max_wall_seconds"))
    return LimitsSpec(
        max_tokens=block.integer("max_tokens", None, minimum=1, nullable=True),
        max_wall_seconds=block.integer("max_wall_seconds", None, minimum=1, nullable=True),
    )
