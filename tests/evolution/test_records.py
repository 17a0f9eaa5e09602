"""Certified records: binding, append-only storage, and tamper detection."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import importlib
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import rfc8785
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from evolution import digests, records
from evolution.models import Candidate, CertifiedResult, Evaluation, Experiment, TreeEntry, Trial
from evolution.services import evaluation as evaluation_services
from evolution.services.records import records_verify, result_certify
from tests.factories import evaluate_seed_inline, make_tiny_experiment, run_evaluation_inline, seed_id, seed_of

pytestmark = pytest.mark.django_db


@contextmanager
def append_only_triggers_dropped() -> Iterator[None]:
    """What an attacker with DDL rights does first. Rolled back with the test."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Run the deferred foreign-key checks first: ALTER TABLE refuses
            # a table with pending trigger events.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("ALTER TABLE evolution_certifiedresult DISABLE TRIGGER USER")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS evolution_certifiedresult_no_update")
    yield


def json_param() -> str:
    return "%s::jsonb" if connection.vendor == "postgresql" else "%s"


def run_verify(experiment: Experiment | None = None) -> tuple[int, str]:
    out = io.StringIO()
    args = ["--experiment", str(experiment.pk)] if experiment else []
    try:
        call_command("verify_records", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


@pytest.fixture
def certified() -> Experiment:
    experiment = make_tiny_experiment(tasks=8, k=2)
    evaluation = evaluate_seed_inline(experiment)
    assert evaluation.state == Evaluation.State.CERTIFIED
    experiment.refresh_from_db()
    return experiment


def test_certified_record_binds_what_was_measured(certified: Experiment) -> None:
    record = CertifiedResult.objects.get(experiment=certified)
    payload = record.payload
    seed = seed_of(certified)
    assert record.seq == 1
    assert record.prev_digest == records.GENESIS
    assert payload["candidate"]["tree"] == seed.tree_id
    assert payload["task_sets"] == certified.split_digests
    assert payload["k"] == 2
    assert len(payload["trials"]) == 16
    assert {row["outcome"] for row in payload["trials"]} == {"pass", "fail"}
    assert payload["evaluator"]["sandbox_profile"] in {"bwrap", "none"}
    assert payload["run_settings"] == {"model": "tiny", "seed": 11}
    assert record.record_digest == records.record_digest(payload)
    assert certified.chain_length == 1 and certified.chain_head == record.record_digest
    seed.refresh_from_db()
    assert seed.state == Candidate.State.CERTIFIED
    assert seed.certified_at is not None


def test_verify_records_passes_on_intact_records(certified: Experiment) -> None:
    code, out = run_verify(certified)
    assert code == 0, out
    assert "chain of 1 record(s)" in out
    assert "16 trial(s)" in out
    assert "MISMATCH" not in out


def test_certification_runs_once_however_often_it_is_called(certified: Experiment) -> None:
    evaluation = Evaluation.objects.get(experiment=certified)
    again = result_certify(evaluation_id=evaluation.pk)
    assert again is not None and again.seq == 1
    assert CertifiedResult.objects.filter(experiment=certified).count() == 1
    certified.refresh_from_db()
    assert certified.chain_length == 1


def test_model_refuses_update_and_delete(certified: Experiment) -> None:
    record = CertifiedResult.objects.get(experiment=certified)
    record.signature = "0" * 64
    with pytest.raises(PermissionError):
        record.save()
    with pytest.raises(PermissionError):
        record.delete()
    with pytest.raises(PermissionError):
        CertifiedResult.objects.filter(pk=record.pk).update(signature="x")
    with pytest.raises(PermissionError):
        CertifiedResult.objects.filter(pk=record.pk).delete()
    assert CertifiedResult.objects.get(pk=record.pk).signature != "0" * 64


def test_database_trigger_rejects_raw_update(certified: Experiment) -> None:
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE evolution_certifiedresult SET signature = 'forged'")
    assert not CertifiedResult.objects.filter(signature="forged").exists()


def test_postgres_trigger_rejects_raw_delete(postgres: None, certified: Experiment) -> None:
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM evolution_certifiedresult")
    assert CertifiedResult.objects.filter(experiment=certified).count() == 1


def test_raw_sql_edit_of_a_trial_score_is_detected(certified: Experiment) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE evolution_trial SET outcome = 'pass', score = 1.0 WHERE id = "
            "(SELECT MIN(id) FROM evolution_trial WHERE outcome = 'fail')"
        )
    code, out = run_verify(certified)
    assert code == 1
    assert "1 trial row(s) differ from the certified results" in out


@pytest.mark.parametrize(
    ("column", "value"),
    [("valid_output", False), ("submitted", False), ("steps", 99), ("error_kind", "infra")],
)
def test_raw_sql_edit_of_any_bound_trial_fact_is_detected(certified: Experiment, column: str, value: Any) -> None:
    """Verification reads the trial rows as the driver returns them (SQLite
    gives booleans as 0 and 1): an edited boolean is still told apart."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE evolution_trial SET {column} = %s WHERE id = (SELECT MIN(id) FROM evolution_trial)", [value]
        )
    code, out = run_verify(certified)
    assert code == 1
    assert "1 trial row(s) differ from the certified results" in out


def test_raw_sql_edit_of_a_trials_criteria_is_detected(certified: Experiment) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE evolution_trial SET criteria_results = {json_param()} "
            "WHERE id = (SELECT MIN(id) FROM evolution_trial)",
            [json.dumps([{"id": "answer", "met": True, "note": "edited"}])],
        )
    code, out = run_verify(certified)
    assert code == 1
    assert "1 trial row(s) differ from the certified results" in out


def test_raw_sql_edit_of_a_record_payload_is_detected(certified: Experiment) -> None:
    record = CertifiedResult.objects.get(experiment=certified)
    payload = dict(record.payload)
    payload["trials"] = [dict(row, outcome="pass", score=1.0) for row in payload["trials"]]
    with append_only_triggers_dropped(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE evolution_certifiedresult SET payload = %s WHERE id = %s",
            [records.canonical_payload(payload).decode(), record.pk],
        )
    code, out = run_verify(certified)
    assert code == 1
    assert "payload digest" in out


def test_a_record_stores_the_canonical_bytes_its_digest_is_over(certified: Experiment) -> None:
    record = CertifiedResult.objects.get(experiment=certified)
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload FROM evolution_certifiedresult WHERE id = %s", [record.pk])
        (stored,) = cursor.fetchone()
    assert stored.encode() == rfc8785.dumps(record.payload)
    assert hashlib.sha256(stored.encode()).hexdigest() == record.record_digest


def test_a_payload_that_is_not_json_is_reported_not_fatal(certified: Experiment) -> None:
    record = CertifiedResult.objects.get(experiment=certified)
    with append_only_triggers_dropped(), connection.cursor() as cursor:
        cursor.execute("UPDATE evolution_certifiedresult SET payload = %s WHERE id = %s", ['{"seq": 1,', record.pk])
    assert CertifiedResult.objects.get(pk=record.pk).payload == '{"seq": 1,'
    code, out = run_verify(certified)
    assert code == 1
    assert "payload is not a JSON object" in out
    assert "payload digest" in out


def test_the_migration_to_canonical_text_rewrites_every_payload_and_keeps_the_trigger(certified: Experiment) -> None:
    """0009 changed the column from JSON to text: the rows then hold the
    database's own JSON text, which ``canonicalize`` rewrites."""
    migration = importlib.import_module("evolution.migrations.0009_certified_result_canonical_payload")
    record = CertifiedResult.objects.get(experiment=certified)
    loose = json.dumps(record.payload, indent=1)  # what a JSON column gives back: same value, other bytes
    # A second record no certifier wrote: a number RFC 8785 refuses. It is left for verify to report.
    unreadable = json.dumps({**record.payload, "seq": 2, "k": 2**60})
    forged = CertifiedResult(
        experiment=certified,
        seq=2,
        evaluation=Evaluation.objects.create(experiment=certified, candidate=record.candidate),
        candidate=record.candidate,
        payload={},
        prev_digest=record.record_digest,
        record_digest="f" * 64,
        signature="0" * 64,
    )
    forged.save()
    with append_only_triggers_dropped(), connection.cursor() as cursor:
        cursor.execute("UPDATE evolution_certifiedresult SET payload = %s WHERE id = %s", [loose, record.pk])
        cursor.execute("UPDATE evolution_certifiedresult SET payload = %s WHERE id = %s", [unreadable, forged.pk])
    assert "record #1: payload digest" in run_verify(certified)[1]
    migration.canonicalize(None, SimpleNamespace(connection=connection))
    code, out = run_verify(certified)
    assert code == 1
    assert "record #1:" not in out
    assert "record #2: payload digest" in out
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload FROM evolution_certifiedresult WHERE id = %s", [forged.pk])
        assert cursor.fetchone()[0] == unreadable
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE evolution_certifiedresult SET signature = 'forged'")


def test_re_signing_without_the_key_is_detected(certified: Experiment) -> None:
    """A forger can recompute digests (the algorithm is public) but not the HMAC."""
    record = CertifiedResult.objects.get(experiment=certified)
    payload = dict(record.payload, run_settings={"model": "better-model", "seed": 11})
    digest = records.record_digest(payload)
    forged_signature = records.record_signature("guessed-key", experiment_uid=str(certified.uid), seq=1, digest=digest)
    with append_only_triggers_dropped(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE evolution_certifiedresult SET payload = %s, record_digest = %s, signature = %s WHERE id = %s",
            [records.canonical_payload(payload).decode(), digest, forged_signature, record.pk],
        )
        cursor.execute("UPDATE evolution_experiment SET chain_head = %s WHERE id = %s", [digest, certified.pk])
    code, out = run_verify(certified)
    assert code == 1
    assert "signature does not match" in out


def test_replaced_blob_is_detected(certified: Experiment) -> None:
    entry = TreeEntry.objects.get(tree=seed_of(certified).tree, path="default.txt")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE evolution_blob SET content = %s WHERE digest = %s", [b"no\n", entry.blob_id])
    code, out = run_verify(certified)
    assert code == 1
    assert "candidate tree" in out


def test_changed_verifier_file_is_detected(certified: Experiment) -> None:
    entry = TreeEntry.objects.get(tree=certified.evaluator.files, path="verify.py")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE evolution_blob SET content = %s WHERE digest = %s",
            [b'print(\'{"passed": true, "score": 1.0}\')\n', entry.blob_id],
        )
    code, out = run_verify(certified)
    assert code == 1
    assert "evaluator files" in out


def test_changed_private_task_data_is_detected(certified: Experiment) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE evolution_task SET expected = {json_param()} WHERE benchmark_id = %s AND external_id = 't00'",
            ['{"answer": "no"}', certified.benchmark_id],
        )
    code, out = run_verify(certified)
    assert code == 1
    assert "no longer matches its frozen digest" in out


def _second_record(experiment: Experiment) -> None:
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=["train"], purpose=Evaluation.Purpose.NOISE, repeat=1
    )
    run_evaluation_inline(evaluation)
    assert evaluation.state == Evaluation.State.CERTIFIED


def test_chain_links_records_in_order(certified: Experiment) -> None:
    _second_record(certified)
    first, second = CertifiedResult.objects.filter(experiment=certified).order_by("seq")
    assert second.prev_digest == first.record_digest
    assert second.payload["prev"] == first.record_digest
    code, out = run_verify(certified)
    assert code == 0, out


def test_trial_rows_are_checked_against_their_own_record_along_the_chain(certified: Experiment) -> None:
    """The records and the trial rows are read as two streams side by side:
    a record whose trial rows are gone is named, and the next record's rows
    are still compared with that record's own."""
    for repeat in (1, 2):
        evaluation = evaluation_services.evaluation_start(
            candidate=seed_of(certified), splits=["train"], purpose=Evaluation.Purpose.NOISE, repeat=repeat
        )
        run_evaluation_inline(evaluation)
    second, third = (
        CertifiedResult.objects.filter(experiment=certified, seq__in=[2, 3])
        .order_by("seq")
        .select_related("evaluation")
    )
    assert run_verify(certified)[0] == 0
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM evolution_trial WHERE evaluation_id = %s", [second.evaluation_id])
        cursor.execute(
            "UPDATE evolution_trial SET tokens = 7 WHERE id = "
            "(SELECT MAX(id) FROM evolution_trial WHERE evaluation_id = %s)",
            [third.evaluation_id],
        )
    problems = records_verify(experiment=certified).problems
    named = sorted(p for p in problems if "differ from the certified results" in p)
    label = f"experiment {certified.pk} {certified.name!r}"
    assert named == [
        f"{label} record #2: {len(second.payload['trials'])} trial row(s) differ from the certified results",
        f"{label} record #3: 1 trial row(s) differ from the certified results",
    ]


def test_reordered_records_are_detected(certified: Experiment) -> None:
    _second_record(certified)
    with append_only_triggers_dropped(), connection.cursor() as cursor:
        # Swap the two sequence numbers through a temporary value (unique constraint).
        cursor.execute(
            "UPDATE evolution_certifiedresult SET seq = 99 WHERE experiment_id = %s AND seq = 1", [certified.pk]
        )
        cursor.execute(
            "UPDATE evolution_certifiedresult SET seq = 1 WHERE experiment_id = %s AND seq = 2", [certified.pk]
        )
        cursor.execute(
            "UPDATE evolution_certifiedresult SET seq = 2 WHERE experiment_id = %s AND seq = 99", [certified.pk]
        )
    code, out = run_verify(certified)
    assert code == 1
    assert "does not link to the record before it" in out


def test_truncated_chain_is_detected(certified: Experiment) -> None:
    _second_record(certified)
    with append_only_triggers_dropped(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM evolution_certifiedresult WHERE experiment_id = %s AND seq = 2", [certified.pk])
    code, out = run_verify(certified)
    assert code == 1
    assert "chain truncated or extended" in out


def test_certification_is_refused_when_the_evaluator_changed_after_evaluation() -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    for trial_id in evaluation.trials.values_list("pk", flat=True):
        evaluation_services.trial_execute(trial_id=trial_id, owner="test")
    entry = TreeEntry.objects.get(tree=experiment.evaluator.files, path="verify.py")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE evolution_blob SET content = %s WHERE digest = %s", [b"tampered", entry.blob_id])

    assert result_certify(evaluation_id=evaluation.pk) is None

    evaluation.refresh_from_db()
    experiment.refresh_from_db()
    assert evaluation.state == Evaluation.State.FAILED
    assert "certification refused" in evaluation.error
    assert not CertifiedResult.objects.filter(experiment=experiment).exists()
    assert experiment.chain_length == 0
    assert Candidate.objects.get(pk=seed_id(experiment)).state == Candidate.State.FAILED


def test_verify_records_reports_every_experiment(certified: Experiment) -> None:
    other = make_tiny_experiment(tasks=4, k=1)
    evaluate_seed_inline(other)
    report = records_verify()
    assert report.ok, report.problems
    assert sum("chain of 1 record(s)" in line for line in report.checked) == 2


def test_verify_records_unknown_experiment_exits_2() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError) as excinfo:
        call_command("verify_records", "--experiment", "999999")
    assert excinfo.value.returncode == 2


# --- verify_record (pure) ----------------------------------------------------------------

KEY = "unit-test-key"
UID = "00000000-0000-0000-0000-000000000001"


def _signed_record(*, seq: int = 2, prev: str = "a" * 64, score: float = 0.5) -> records.ChainRecord:
    payload = {"schema": records.SCHEMA, "experiment": UID, "seq": seq, "prev": prev, "trials": [{"score": score}]}
    digest = records.record_digest(payload)
    signature = records.record_signature(KEY, experiment_uid=UID, seq=seq, digest=digest)
    return records.ChainRecord(seq, prev, digest, signature, payload)


def test_a_signature_is_the_hmac_of_its_message_under_each_key_however_often_it_is_taken() -> None:
    # The keyed state is kept a key and copied a message: no message or key may leak into another's.
    keys = ["key-one", "key-two", "k" * 200, "é-unicode"]
    messages = ["record\nu\n1\n" + "a" * 64, "", "head\nu\n9\n" + "b" * 64]
    for _ in range(2):
        for key in keys:
            for message in messages:
                expected = hmac.new(key.encode(), message.encode(), hashlib.sha256).hexdigest()
                assert digests.hmac_hex(key, message) == expected


def test_verify_record_finds_nothing_wrong_with_a_good_record() -> None:
    good = _signed_record()
    assert records.verify_record(good, key=KEY, experiment_uid=UID, prev="a" * 64) == []
    assert records.verify_record(good, key=KEY, experiment_uid=UID, prev=None) == []


def test_verify_record_names_an_edited_score() -> None:
    good = _signed_record()
    edited = dataclasses.replace(good, payload={**good.payload, "trials": [{"score": 1.0}]})
    problems = records.verify_record(edited, key=KEY, experiment_uid=UID, prev="a" * 64)
    assert [p.check for p in problems] == [records.RecordCheck.DIGEST]
    assert str(problems[0]).startswith("payload digest ")


def test_verify_record_names_a_wrong_predecessor() -> None:
    good = _signed_record()
    problems = records.verify_record(good, key=KEY, experiment_uid=UID, prev="b" * 64)
    assert [p.check for p in problems] == [records.RecordCheck.LINKS]
    assert "does not link to the record before it" in str(problems[0])
    # A stored prev that the payload does not name is caught without knowing the chain.
    relinked = dataclasses.replace(good, prev_digest="b" * 64)
    problems = records.verify_record(relinked, key=KEY, experiment_uid=UID, prev=None)
    assert [p.check for p in problems] == [records.RecordCheck.NAMES_PREDECESSOR]


def test_verify_record_names_a_wrong_signature() -> None:
    good = _signed_record()
    for signature in (
        "0" * 64,
        records.record_signature("other-key", experiment_uid=UID, seq=2, digest=good.record_digest),
    ):
        forged = dataclasses.replace(good, signature=signature)
        problems = records.verify_record(forged, key=KEY, experiment_uid=UID, prev="a" * 64)
        assert [p.check for p in problems] == [records.RecordCheck.SIGNATURE]
        assert "signature does not match" in str(problems[0])


def test_verify_record_names_a_record_of_another_place() -> None:
    moved = _signed_record(seq=3)
    problems = records.verify_record(dataclasses.replace(moved, seq=2), key=KEY, experiment_uid=UID, prev=None)
    # The signature binds the seq too, so a moved record fails it as well.
    assert [p.check for p in problems] == [records.RecordCheck.NAMES_RECORD, records.RecordCheck.SIGNATURE]
    problems = records.verify_record(moved, key=KEY, experiment_uid=UID.replace("1", "2"), prev=None)
    assert records.RecordCheck.NAMES_RECORD in [p.check for p in problems]
    assert "payload belongs to another experiment" in [str(p) for p in problems]


def _chain(length: int) -> list[records.ChainRecord]:
    chain, prev = [], records.GENESIS
    for seq in range(1, length + 1):
        record = _signed_record(seq=seq, prev=prev, score=seq / 10)
        chain.append(record)
        prev = record.record_digest
    return chain


def _chain_problems(chain: list[records.ChainRecord], *, named: bool) -> list[str]:
    checker = records.ChainChecker(key=KEY, experiment_uid=UID)
    for record in chain:
        canonical = records.canonical_payload(record.payload)
        if named:
            checker.add_named(record, canonical=canonical)
        else:
            checker.add(record, canonical=canonical)
    last = chain[-1].record_digest
    signature = records.head_signature(KEY, experiment_uid=UID, length=len(chain), head=last)
    return checker.finish(records.ChainHead(len(chain), last, signature))


def test_a_record_added_as_named_by_its_payload_is_reported_as_add_reports_it() -> None:
    # add_named checks only what a payload verification built cannot vouch for (seq, link, digest,
    # signature); whatever fails, the record goes through add and gets the same words.
    good = _chain(4)
    assert _chain_problems(good, named=True) == _chain_problems(good, named=False) == []
    third = good[2]
    forged = {
        "signature": [*good[:2], dataclasses.replace(third, signature="0" * 64), good[3]],
        "digest": [*good[:2], dataclasses.replace(third, record_digest="c" * 64), good[3]],
        "link": [*good[:2], dataclasses.replace(third, prev_digest="b" * 64), good[3]],
        "seq": [*good[:2], good[3]],
    }
    for name, chain in forged.items():
        problems = _chain_problems(chain, named=True)
        assert problems, name
        assert problems == _chain_problems(chain, named=False), name


def test_an_agent_with_the_network_is_certified_as_such() -> None:
    experiment = make_tiny_experiment(tasks=4, k=1, agent_network=True)
    evaluation = evaluate_seed_inline(experiment)
    assert evaluation.state == Evaluation.State.CERTIFIED
    payload = CertifiedResult.objects.get(experiment=experiment).payload
    profiles = set(evaluation.trials.values_list("sandbox_profile", flat=True))
    # Under bubblewrap the record names the network the agent kept; without it nothing was isolated anyway.
    assert profiles in ({"bwrap+agent-network"}, {"none"})
    assert payload["evaluator"]["sandbox_profile"] == next(iter(profiles))
    code, out = run_verify(experiment)
    assert code == 0, out

    # The same evaluator without the network has another digest, which the record would not match.
    evaluator = experiment.evaluator
    fields: dict[str, Any] = {
        "files_tree": evaluator.files_id,
        "runner_argv": evaluator.runner_argv,
        "verifier_argv": evaluator.verifier_argv,
        "env_allowlist": evaluator.env_allowlist,
        "timeout_seconds": evaluator.timeout_seconds,
        "limits": evaluator.limits,
        "sandbox_profile": payload["evaluator"]["sandbox_profile"],
    }
    assert payload["evaluator"]["digest"] == digests.evaluator_digest(**fields, agent_network=True)
    assert payload["evaluator"]["digest"] != digests.evaluator_digest(**fields)


def test_an_evaluator_without_the_network_keeps_the_digest_it_had_before_the_setting() -> None:
    fields: dict[str, Any] = {
        "files_tree": "a" * 64,
        "runner_argv": ["run"],
        "verifier_argv": ["verify"],
        "env_allowlist": ["PATH"],
        "timeout_seconds": 30,
        "limits": {},
        "sandbox_profile": "bwrap",
    }
    # The document every existing record's evaluator digest is over: no agent_network key in it.
    before = digests.json_digest(
        {
            "kind": "evaluator/1",
            "files": "a" * 64,
            "runner": ["run"],
            "verifier": ["verify"],
            "env_allowlist": ["PATH"],
            "timeout_seconds": 30,
            "limits": {},
            "sandbox_profile": "bwrap",
        }
    )
    assert digests.evaluator_digest(**fields) == before
    assert digests.evaluator_digest(**fields, agent_network=False) == before


def test_the_environment_a_trial_ran_in_is_certified_and_checked(certified: Experiment) -> None:
    """A record binds the digests of the Debian-built environments its trials
    ran in (none here: the host's system) and verify_records recomputes them
    from the trials: a trial stamped with an environment afterwards, or one
    whose stamp is removed, is named."""
    record = CertifiedResult.objects.get(experiment=certified, seq=1)
    assert "environments" not in record.payload["evaluator"]
    assert run_verify(certified)[0] == 0
    trial = Trial.objects.filter(evaluation=record.evaluation).order_by("pk").first()
    assert trial is not None
    Trial.objects.filter(pk=trial.pk).update(environment="e" * 64)
    problems = records_verify(experiment=certified).problems
    label = f"experiment {certified.pk} {certified.name!r}"
    assert f"{label} record #1: the trials' Debian-built environments differ from the certified ones" in problems
