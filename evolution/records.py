"""Certified records: digests, signatures and chain verification (pure).

A record's payload names what was measured (candidate tree, evaluator, task
sets, recipe, run settings, k, every trial's outcome) and its predecessor's
digest. ``record_digest`` is SHA-256 over the RFC 8785 canonical payload; the
signature is an HMAC of the digest with a key kept outside the database. The
chain head (length, last digest) is signed too, so dropping the newest
records is as visible as editing or reordering older ones.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from evolution import digests

SCHEMA = "rsiweb.certified-result/1"
GENESIS = "0" * 64


def record_digest(payload: dict[str, Any]) -> str:
    return digests.sha256_hex(canonical_payload(payload))


# Integers beyond this lose precision as IEEE doubles; RFC 8785 is left to judge them.
_MAX_SAFE_INT = 2**53 - 1


def canonical_payload(payload: Any) -> bytes:
    """RFC 8785 canonical bytes of ``payload``, the same as
    ``digests.canonical_json`` but through the C JSON encoder when that
    gives the same bytes, which is about ten times faster.

    Python's compact, key-sorted, non-ASCII JSON differs from RFC 8785 only
    in number formatting, in key order when keys hold characters outside
    the Basic Multilingual Plane (RFC 8785 sorts by UTF-16 code units), and
    in lone surrogates. Integral floats are written as integers (as RFC 8785
    does); any other float whose shortest repr is exponential, a huge
    integer, a non-string key or a key outside the BMP sends the whole value
    to the RFC 8785 implementation instead.
    """
    try:
        plain = _plain(payload)
        return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (_NotPlain, ValueError, UnicodeEncodeError):
        return digests.canonical_json(payload)


class _NotPlain(Exception):
    pass


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
            return value
        raise _NotPlain
    if kind is float:
        if value.is_integer():
            if -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
                return int(value)
            raise _NotPlain
        if "e" in repr(value) or "n" in repr(value):  # exponent, inf or nan
            raise _NotPlain
        return value
    if kind is dict:
        for key in value:
            if type(key) is not str or not (key.isascii() or max(key) <= "\uffff"):
                raise _NotPlain
        return {key: _plain(child) for key, child in value.items()}
    if kind is list or kind is tuple:
        return [_plain(child) for child in value]
    raise _NotPlain


def record_signature(key: str, *, experiment_uid: str, seq: int, digest: str) -> str:
    return digests.hmac_hex(key, f"record\n{experiment_uid}\n{seq}\n{digest}")


def head_signature(key: str, *, experiment_uid: str, length: int, head: str) -> str:
    return digests.hmac_hex(key, f"head\n{experiment_uid}\n{length}\n{head}")


@dataclass(frozen=True)
class ChainRecord:
    seq: int
    prev_digest: str
    record_digest: str
    signature: str
    payload: dict[str, Any]


class StreamedRecord(NamedTuple):
    """A ``ChainRecord`` as a verification streaming a long chain builds one
    a record: a tuple, made in a third of a frozen dataclass's time."""

    seq: int
    prev_digest: str
    record_digest: str
    signature: str
    payload: Any


@dataclass(frozen=True)
class ChainHead:
    length: int
    head: str
    signature: str


class RecordCheck(StrEnum):
    """What ``verify_record`` checks of one record, by name (shown to users)."""

    NAMES_RECORD = "names this record"
    NAMES_PREDECESSOR = "names its predecessor"
    LINKS = "links to the record before it"
    DIGEST = "payload digest"
    SIGNATURE = "signature"


@dataclass(frozen=True)
class RecordProblem:
    check: RecordCheck
    detail: str

    def __str__(self) -> str:
        return self.detail


class RecordLike(Protocol):
    """A stored record: a ``ChainRecord`` or a ``CertifiedResult`` row (read-only)."""

    @property
    def seq(self) -> int: ...
    @property
    def prev_digest(self) -> str: ...
    @property
    def record_digest(self) -> str: ...
    @property
    def signature(self) -> str: ...
    @property
    def payload(self) -> dict[str, Any]: ...


def verify_record(
    record: RecordLike, *, key: str, experiment_uid: str, prev: str | None, canonical: bytes | None = None
) -> list[RecordProblem]:
    """Every problem found in one record on its own; empty when it checks out.

    Checks that the payload names this record (seq, experiment) and its
    stored predecessor, that the stored digest is the payload's digest, and
    the signature. ``prev`` is the stored digest of the record before it
    (``GENESIS`` for the first); None when unknown skips the link check.
    ``canonical``: the bytes the digest is taken over when they are at hand
    (the stored canonical text); otherwise they are computed from the payload.
    Pure; safe to repeat.
    """
    problems: list[RecordProblem] = []
    payload = record.payload

    def problem(check: RecordCheck, detail: str) -> None:
        problems.append(RecordProblem(check, detail))

    if not isinstance(payload, dict):
        problem(RecordCheck.NAMES_RECORD, f"payload is not a JSON object ({str(payload)[:40]!r})")
        payload = {}

    if payload.get("seq") != record.seq:
        problem(RecordCheck.NAMES_RECORD, f"payload seq {payload.get('seq')!r} differs from stored seq")
    if payload.get("experiment") != experiment_uid:
        problem(RecordCheck.NAMES_RECORD, "payload belongs to another experiment")
    if payload.get("prev") != record.prev_digest:
        problem(
            RecordCheck.NAMES_PREDECESSOR,
            f"payload prev {str(payload.get('prev'))[:12]} != stored prev {record.prev_digest[:12]}",
        )
    if prev is not None and record.prev_digest != prev:
        problem(
            RecordCheck.LINKS,
            f"does not link to the record before it (stored prev {record.prev_digest[:12]}, its digest {prev[:12]})",
        )
    recomputed = digests.sha256_hex(canonical if canonical is not None else canonical_payload(record.payload))
    if recomputed != record.record_digest:
        problem(RecordCheck.DIGEST, f"payload digest {recomputed[:12]} != stored {record.record_digest[:12]}")
    expected_sig = record_signature(key, experiment_uid=experiment_uid, seq=record.seq, digest=record.record_digest)
    if not hmac.compare_digest(expected_sig, record.signature):
        problem(RecordCheck.SIGNATURE, "signature does not match (forged or signed with another key)")
    return problems


def verify_chain(records: Iterable[RecordLike], *, key: str, experiment_uid: str, head: ChainHead) -> list[str]:
    """Every problem found in one experiment's chain; empty when intact.

    ``records`` must be in storage order by seq (any iterable: it is read
    once). Checks contiguity from 1, each record (``verify_record``, linked
    to the one before it), and the signed head against the last record.
    """
    checker = ChainChecker(key=key, experiment_uid=experiment_uid)
    for record in records:
        checker.add(record)
    return checker.finish(head)


class ChainChecker:
    """``verify_chain`` one record at a time, so a long chain is never held
    in memory: ``add`` each record in seq order, then ``finish`` with the
    head; ``problems`` collects what both found."""

    def __init__(self, *, key: str, experiment_uid: str) -> None:
        self.key, self.experiment_uid = key, experiment_uid
        self.problems: list[str] = []
        self.count = 0
        self.prev = GENESIS
        self.last: str | None = None

    def add(self, record: RecordLike, *, canonical: bytes | None = None) -> None:
        self.count += 1
        if record.seq != self.count:
            self.problems.append(f"record #{record.seq}: expected seq {self.count} (records missing or reordered)")
        found = verify_record(
            record, key=self.key, experiment_uid=self.experiment_uid, prev=self.prev, canonical=canonical
        )
        if found:  # the label is written only for a record with problems: most of a long chain has none
            self.problems += [f"record #{record.seq}: {problem}" for problem in found]
        self.prev = self.last = record.record_digest

    def add_named(self, record: RecordLike, *, canonical: bytes) -> None:
        """``add`` for a record whose payload is known to name its own seq,
        this experiment and its stored predecessor (verification built the
        payload from those and found ``canonical``, its stored bytes, equal):
        only the seq, link, digest and signature are left to check. A record
        failing any of them goes through ``add``, which says what is wrong."""
        if (
            record.seq == self.count + 1
            and record.prev_digest == self.prev
            and digests.sha256_hex(canonical) == record.record_digest
            and hmac.compare_digest(
                record_signature(
                    self.key, experiment_uid=self.experiment_uid, seq=record.seq, digest=record.record_digest
                ),
                record.signature,
            )
        ):
            self.count += 1
            self.prev = self.last = record.record_digest
            return
        self.add(record, canonical=canonical)

    def finish(self, head: ChainHead) -> list[str]:
        if head.length != self.count:
            self.problems.append(
                f"chain head says {head.length} records, found {self.count} (chain truncated or extended)"
            )
        if head.head != (self.last if self.last is not None else ""):
            self.problems.append("chain head does not point at the last record")
        expected = head_signature(self.key, experiment_uid=self.experiment_uid, length=head.length, head=head.head)
        if (head.length or head.signature) and not hmac.compare_digest(expected, head.signature):
            self.problems.append("chain head signature does not match")
        return self.problems


# --- Decisions in the chain ------------------------------------------------------------------

# Version 2 of a gate record adds the critic's outcome and the review decision it rests on
# (``critic``, ``review``); records of version 1 stay valid as they were written.
GATE_SCHEMA_V1 = "rsiweb.gate-decision/1"
GATE_SCHEMA = "rsiweb.gate-decision/2"
REVIEW_SCHEMA = "rsiweb.review-decision/1"
# A reviewer's correction of an earlier review record of the same candidate (``corrects``: its seq and digest).
CORRECTION_SCHEMA = "rsiweb.review-correction/1"
REVIEW_SCHEMAS = (REVIEW_SCHEMA, CORRECTION_SCHEMA)
# The kind of decision record (``CertifiedDecision.kind``) each schema is stored as.
DECISION_SCHEMAS = {
    GATE_SCHEMA_V1: "gate",
    GATE_SCHEMA: "gate",
    REVIEW_SCHEMA: "review",
    CORRECTION_SCHEMA: "correction",
}
# Corrections certified before they had a kind of their own were stored as "review" records; they stay valid.
EARLIER_KINDS = {CORRECTION_SCHEMA: "review"}


def kind_problem(payload: Any, kind: str) -> str:
    """Why a decision record stored as ``kind`` does not hold that kind of payload ("" when it does). Pure."""
    schema = str(payload.get("schema")) if isinstance(payload, dict) else ""
    if kind in (DECISION_SCHEMAS.get(schema), EARLIER_KINDS.get(schema)):
        return ""
    return f"payload is not a {kind} decision"


# Marks a decision certified by the upgrade that introduced decision records:
# it certifies what the database held then, not the moment of the decision.
AT_UPGRADE = "at upgrade"

# The candidate states only a decision sets, and the kind of decision that
# sets each. A candidate in one of them needs a certified decision saying so.
DECIDED_STATES = {"accepted": "gate", "rejected_gate": "gate", "rejected_review": "review"}


def gate_payload(
    *,
    experiment_uid: str,
    seq: int,
    prev: str,
    candidate_tree: str,
    current_tree: str | None,
    round: int,
    accepted: bool,
    chosen: bool,
    rule: str,
    explanation: str,
    numbers: Any,
    state: str,
    reason: str,
    recipe: str | None,
    surface: str | None,
    certified: str | None = None,
    critic: CriticOutcome | None = None,
    review: ReviewBasis | None = None,
) -> dict[str, Any]:
    """The payload certifying one gate decision: the verdict, the rule, the
    numbers it used, the candidate's resulting state and reason, and the
    digests of the recipe and surface it was decided under. With ``critic``
    (version 2, what the gate writes now) also the critic's flags of the
    candidate (count and ``flags_digest``) and the certified review decision
    that cleared it (``review``: its record's seq and digest, None when no
    review decided it); without (version 1) as the upgrade of migration 0011
    writes them."""
    payload: dict[str, Any] = {
        "schema": GATE_SCHEMA if critic is not None else GATE_SCHEMA_V1,
        "experiment": experiment_uid,
        "seq": seq,
        "prev": prev,
        "candidate": {"tree": candidate_tree},
        "gate": {
            "round": round,
            "current": current_tree,
            "accepted": accepted,
            "chosen": chosen,
            "rule": rule,
            "explanation": explanation,
            "numbers": numbers,
        },
        "state": {"name": state, "reason": reason},
        "recipe": recipe,
        "surface": surface,
    }
    if critic is not None:
        payload["critic"] = {"flags": critic.flags, "digest": critic.digest}
        payload["review"] = {"seq": review.seq, "record": review.record} if review is not None else None
    if certified:
        payload["certified"] = certified
    return payload


@dataclass(frozen=True)
class CriticOutcome:
    """The critic's flags of one candidate: how many, and their ``flags_digest``."""

    flags: int
    digest: str


@dataclass(frozen=True)
class ReviewBasis:
    """The certified review decision a gate decision rests on: its record's seq and digest."""

    seq: int
    record: str


def flags_digest(flags: Iterable[tuple[str, str, str, str]]) -> str:
    """SHA-256 of a candidate's critic flags, each (rule, path, line, matched),
    in a stable order (the order they were stored in does not matter). Pure."""
    rows = sorted([str(part) for part in flag] for flag in flags)
    return record_digest({"flags": rows})


def critic_outcome(flags: Iterable[tuple[str, str, str, str]]) -> CriticOutcome:
    rows = list(flags)
    return CriticOutcome(len(rows), flags_digest(rows))


NO_FLAGS = critic_outcome([])


def review_basis_problems(
    decisions: Iterable[tuple[int, str, Any]], critic: Mapping[str, CriticOutcome], held: Iterable[str] = ()
) -> list[str]:
    """Gate records checked against the critic's flags and the review decisions; empty when they agree.

    ``decisions``: (seq, record digest, payload) of the decision records in
    seq order. ``critic``: each candidate tree's flags as stored now (a tree
    not in it has none); ``held``: trees held for a reviewer (a review item).
    A gate record of version 2 must state exactly the flags the candidate
    has, and a candidate with flags (or held for review) must rest on an
    earlier certified review record of the same candidate approving it,
    named by digest. A gate record of version 1 binds neither: the candidate
    still needs such a review record somewhere in the chain. Pure.
    """
    held = set(held)
    decisions = list(decisions)
    approvals: dict[str, dict[str, int]] = {}  # tree -> review record digest -> seq
    for seq, digest, payload in decisions:
        if (
            isinstance(payload, dict)
            and payload.get("schema") in REVIEW_SCHEMAS
            and (payload.get("review") or {}).get("verdict") == "approve"
        ):
            approvals.setdefault(str((payload.get("candidate") or {}).get("tree")), {})[digest] = seq
    problems = []
    for seq, _, payload in decisions:
        if not isinstance(payload, dict) or DECISION_SCHEMAS.get(str(payload.get("schema"))) != "gate":
            continue  # a malformed payload is reported by the chain check
        tree = str((payload.get("candidate") or {}).get("tree"))
        where = f"record #{seq}: candidate {tree[:12]}"
        outcome = critic.get(tree, NO_FLAGS)
        flags = outcome.flags
        if payload["schema"] == GATE_SCHEMA:
            certified = payload.get("critic")
            bound = (certified.get("flags"), certified.get("digest")) if isinstance(certified, dict) else None
            if bound != (outcome.flags, outcome.digest):
                problems.append(
                    f"{where}: its critic flags differ from the gate record's "
                    f"({outcome.flags} stored, the record binds {bound[0] if bound else None!r})"
                )
                if bound and isinstance(bound[0], int):
                    flags = max(flags, bound[0])
            basis = payload.get("review")
            if basis is not None:
                # The named review record: an earlier approval of this candidate, at the seq it gives.
                earlier = isinstance(basis, dict) and isinstance(basis.get("seq"), int) and basis["seq"] < seq
                if not earlier or approvals.get(tree, {}).get(str(basis.get("record"))) != basis.get("seq"):
                    problems.append(f"{where}: the review decision its gate record names is not a certified approval")
                continue
        elif approvals.get(tree):
            continue
        if flags > 0 or tree in held:
            problems.append(f"{where}: gated with {flags} critic flag(s) and no certified review decision approving it")
    return problems


def review_payload(
    *,
    experiment_uid: str,
    seq: int,
    prev: str,
    candidate_tree: str,
    verdict: str,
    reason: str,
    reviewer: str,
    rejected_edits: list[int],
    derived_tree: str | None,
    state: str,
    state_reason: str,
    recipe: str | None,
    surface: str | None,
    certified: str | None = None,
) -> dict[str, Any]:
    """The payload certifying one review decision: verdict, reason, who,
    which atomic edits (by index) were rejected, the derived candidate, and
    the reviewed candidate's resulting state and reason."""
    payload = {
        "schema": REVIEW_SCHEMA,
        "experiment": experiment_uid,
        "seq": seq,
        "prev": prev,
        "candidate": {"tree": candidate_tree},
        "review": {
            "verdict": verdict,
            "reason": reason,
            "reviewer": reviewer,
            "rejected_edits": sorted(rejected_edits),
            "derived": derived_tree,
        },
        "state": {"name": state, "reason": state_reason},
        "recipe": recipe,
        "surface": surface,
    }
    if certified:
        payload["certified"] = certified
    return payload


def correction_payload(
    *,
    experiment_uid: str,
    seq: int,
    prev: str,
    candidate_tree: str,
    corrects_seq: int,
    corrects_record: str,
    verdict: str,
    reason: str,
    reviewer: str,
    state: str,
    state_reason: str,
    recipe: str | None,
    surface: str | None,
    corrects_verdict: str,
    withdrawn: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The payload certifying a correction of a review decision: that it is a correction, the record it
    corrects (seq, digest and the verdict it certified: an earlier review record of the same candidate), the
    new verdict, reason, who, and the candidate's state and reason after it. Its ``review`` section has the
    fields of a review decision's. ``withdrawn``: when the corrected decision rejected some edits, the
    candidate it derived and withdrew now (tree, state and reason after it), else None."""
    return {
        "schema": CORRECTION_SCHEMA,
        "experiment": experiment_uid,
        "seq": seq,
        "prev": prev,
        "candidate": {"tree": candidate_tree},
        "correction": True,
        "corrects": {"seq": corrects_seq, "record": corrects_record, "verdict": corrects_verdict},
        "withdrawn": withdrawn,
        "review": {
            "verdict": verdict,
            "reason": reason,
            "reviewer": reviewer,
            "rejected_edits": [],
            "derived": None,
        },
        "state": {"name": state, "reason": state_reason},
        "recipe": recipe,
        "surface": surface,
    }


def correction_problems(decisions: Iterable[tuple[int, str, Any]]) -> list[str]:
    """Correction records checked against the chain; empty when they agree.

    ``decisions``: (seq, record digest, payload) of the decision records in seq order. A correction must
    name, by seq and digest, an earlier review record (decision or correction) of the same candidate, and
    that record must be the candidate's latest review record when the correction was made (a correction
    never forks: each record is corrected at most once). Pure."""
    problems = []
    reviews: dict[int, tuple[str, str]] = {}  # seq -> (digest, tree) of review records so far
    verdicts: dict[int, tuple[Any, Any]] = {}  # seq -> (verdict, derived tree) they certified
    latest: dict[str, int] = {}  # tree -> seq of its latest review record
    corrected: set[int] = set()
    for seq, digest, payload in decisions:
        if not isinstance(payload, dict) or payload.get("schema") not in REVIEW_SCHEMAS:
            continue
        tree = str((payload.get("candidate") or {}).get("tree"))
        review = payload.get("review")
        review = review if isinstance(review, dict) else {}
        if payload["schema"] == CORRECTION_SCHEMA:
            problems += _correction_problems(seq, payload, tree, reviews, verdicts, latest, corrected)
        reviews[seq] = (digest, tree)
        verdicts[seq] = (review.get("verdict"), review.get("derived"))
        latest[tree] = seq
    return problems


def _correction_problems(
    seq: int,
    payload: dict[str, Any],
    tree: str,
    reviews: dict[int, tuple[str, str]],
    verdicts: dict[int, tuple[Any, Any]],
    latest: dict[str, int],
    corrected: set[int],
) -> list[str]:
    """One correction record against the review records before it (``correction_problems``)."""
    where = f"record #{seq}: correction of candidate {tree[:12]}"
    named = payload.get("corrects")
    named = named if isinstance(named, dict) else {}
    named_seq = named.get("seq")
    if not isinstance(named_seq, int) or reviews.get(named_seq) != (str(named.get("record")), tree):
        return [f"{where}: the record it corrects is not an earlier review record of that candidate"]
    if named_seq in corrected or latest.get(tree) != named_seq:
        return [f"{where}: record #{named_seq} was corrected already"]
    corrected.add(named_seq)
    problems = []
    verdict, derived = verdicts[named_seq]
    # Records before the correction kind named neither; a newer one must say what it corrects.
    if "correction" in payload and (payload.get("correction") is not True or named.get("verdict") != verdict):
        problems.append(f"{where}: it does not say it is a correction of the {verdict} verdict of record #{named_seq}")
    withdrawn = payload.get("withdrawn")
    if withdrawn is not None and (
        not isinstance(withdrawn, dict) or verdict != "reject_edits" or withdrawn.get("tree") != derived
    ):
        problems.append(f"{where}: it withdraws a candidate the corrected record did not derive")
    return problems


@dataclass(frozen=True)
class CandidateState:
    """What verification compares of one candidate with its decisions."""

    tree: str
    state: str
    reason: str
    origin: str


def candidate_state_problems(
    candidates: Iterable[CandidateState], decisions: Iterable[tuple[int, Any]], *, known_states: Iterable[str]
) -> list[str]:
    """Candidate states checked against the certified decisions; empty when they agree.

    ``decisions``: (seq, payload) of the decision records, in seq order. A
    decision that certified a state of ``DECIDED_STATES`` (accepted,
    rejected by the gate or by review: states nothing moves a candidate out
    of) must still be the candidate's state, with the same reason; and a
    candidate in such a state needs a decision that certified it (an
    imported workspace's candidate keeps its source's rejection, never
    certified here, but is never accepted without one). An unknown state is
    a problem. Pure.
    """
    known = set(known_states)
    last: dict[str, tuple[int, str, str, str]] = {}
    for seq, payload in decisions:
        if not isinstance(payload, dict):
            continue  # reported by the chain check
        kind = DECISION_SCHEMAS.get(str(payload.get("schema")))
        state = payload.get("state") or {}
        tree = str((payload.get("candidate") or {}).get("tree"))
        if kind and isinstance(state, dict) and state.get("name") in DECIDED_STATES:
            last[tree] = (seq, kind, str(state.get("name")), str(state.get("reason")))
        elif payload.get("schema") == CORRECTION_SCHEMA:
            # A correction approving a rejected candidate moves it out of a decided state (it is evaluated again).
            last.pop(tree, None)
        withdrawn = payload.get("withdrawn") if payload.get("schema") == CORRECTION_SCHEMA else None
        if isinstance(withdrawn, dict) and withdrawn.get("state") in DECIDED_STATES:
            # The candidate a corrected partial decision derived, withdrawn by the correction.
            last[str(withdrawn.get("tree"))] = (
                seq,
                "correction",
                str(withdrawn["state"]),
                str(withdrawn.get("reason")),
            )
    problems = []
    for candidate in candidates:
        where = f"candidate {candidate.tree[:12]}"
        if candidate.state not in known:
            problems.append(f"{where}: unknown state {candidate.state!r}")
            continue
        if candidate.tree in last:
            seq, kind, state, reason = last[candidate.tree]
            if candidate.state != state:
                problems.append(
                    f"{where}: state {candidate.state!r}, but the certified {kind} decision (record #{seq}) "
                    f"made it {state!r}"
                )
            elif candidate.reason != reason:
                problems.append(f"{where}: state reason differs from the certified {kind} decision (record #{seq})")
        elif candidate.state in DECIDED_STATES and (candidate.state == "accepted" or candidate.origin != "imported"):
            problems.append(
                f"{where}: state {candidate.state!r} with no certified {DECIDED_STATES[candidate.state]} decision"
            )
    return problems
