"""Secrets are redacted wherever they sit in a trajectory, and look-alikes are kept."""

from __future__ import annotations

from typing import Any

import pytest

from evolution.redaction import redact, redact_text

OPENAI = "sk-proj-" + "AbCdEfGh0123456789IjKlMnOpQrStUv"
SECRETS = {
    "openai_api_key": OPENAI,
    "anthropic_api_key": "sk-ant-api03-" + "Zx9" * 10,
    "aws_access_key_id": "AKIAIOSFODNN7EXAMPLE",
    "github_token": "ghp_" + "a1B2c3D4e5" * 4,
    "slack_token": "xoxb-123456789012-1234567890123-AbCdEfGhIjKl",
    "google_api_key": "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
}


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_each_key_kind_is_redacted_in_text(kind: str) -> None:
    secret = SECRETS[kind]
    text, counts = redact_text(f"export KEY={secret}; run")
    assert text == f"export KEY=[REDACTED:{kind}]; run"
    assert counts == {kind: 1}


def test_github_fine_grained_token() -> None:
    assert redact("token github_pat_11ABCDEFG0_abcdefghijklmnopqrstuvwxyz") == (
        "token [REDACTED:github_token]",
        {"github_token": 1},
    )


def test_bearer_token_in_an_authorization_header_keeps_the_header() -> None:
    text, counts = redact_text('curl -H "Authorization: Bearer abc.def-ghi_123" https://x')
    assert text == 'curl -H "Authorization: Bearer [REDACTED:bearer_token]" https://x'
    assert counts == {"bearer_token": 1}
    # A header dict: the value alone.
    assert redact({"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.payload123"}) == (
        {"Authorization": "Bearer [REDACTED:bearer_token]"},
        {"bearer_token": 1},
    )


def test_private_key_block_is_redacted_whole() -> None:
    block = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nAAAA\n-----END OPENSSH PRIVATE KEY-----"
    assert redact_text(f"cat id_ed25519\n{block}\n$ next") == (
        "cat id_ed25519\n[REDACTED:private_key]\n$ next",
        {"private_key": 1},
    )
    # A truncated block (no END line) is redacted to the end of the text.
    assert redact_text("-----BEGIN RSA PRIVATE KEY-----\nMIIEow") == ("[REDACTED:private_key]", {"private_key": 1})


def test_passwords_in_urls() -> None:
    text, counts = redact_text(
        "GET https://db.example/login?user=me&password=hunter2&x=1 and postgres://me:s3cr3t@db/x"
    )
    assert text == (
        "GET https://db.example/login?user=me&password=[REDACTED:url_password]&x=1 "
        "and postgres://me:[REDACTED:url_password]@db/x"
    )
    assert counts == {"url_password": 2}


def test_aws_secret_access_key_assignment() -> None:
    text, counts = redact_text("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    assert (text, counts) == ("aws_secret_access_key = [REDACTED:aws_secret_access_key]", {"aws_secret_access_key": 1})


@pytest.mark.parametrize(
    "innocent",
    [
        "task-sk-1 failed",
        "sk-learn is a nickname",
        "sk-this-is-a-long-hyphenated-description-of-things",
        "the AKIA prefix marks AWS keys",
        "AKIA1234",
        "the bearer of bad news",
        "Authorization: Basic is not bearer",
        "ghp_short",
        "https://example.com/path?page=2",
        "mailto:someone@example.com",
        "[REDACTED:openai_api_key]",
    ],
)
def test_look_alikes_are_kept(innocent: str) -> None:
    assert redact_text(innocent) == (innocent, {})


def test_recurses_through_nested_json_and_counts_by_kind() -> None:
    document: dict[str, Any] = {
        "steps": [
            {"message": f"key {OPENAI}", "tool_calls": [{"arguments": {"env": {"KEY": OPENAI}, "n": 3}}]},
            {"observation": {"results": [{"content": SECRETS["aws_access_key_id"]}]}, "ok": True, "none": None},
        ],
        "extra": {"nested": [[SECRETS["github_token"]]]},
    }
    cleaned, counts = redact(document)
    assert counts == {"aws_access_key_id": 1, "github_token": 1, "openai_api_key": 2}
    assert cleaned["steps"][0]["tool_calls"][0]["arguments"] == {"env": {"KEY": "[REDACTED:openai_api_key]"}, "n": 3}
    assert cleaned["steps"][1] == {
        "observation": {"results": [{"content": "[REDACTED:aws_access_key_id]"}]},
        "ok": True,
        "none": None,
    }
    assert cleaned["extra"] == {"nested": [["[REDACTED:github_token]"]]}
    assert OPENAI in document["steps"][0]["message"]  # the input is not changed


def test_redacting_twice_finds_nothing_more() -> None:
    once, counts = redact({"m": f"{OPENAI} {SECRETS['slack_token']}"})
    assert sum(counts.values()) == 2
    assert redact(once) == (once, {})


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_secrets_among_non_ascii_text_are_redacted(kind: str) -> None:
    cleaned, counts = redact({"steps": [{"message": f"caf\u00e9 \u4e2d\U0001f600 {SECRETS[kind]} \u00e9"}]})
    assert cleaned == {"steps": [{"message": f"caf\u00e9 \u4e2d\U0001f600 [REDACTED:{kind}] \u00e9"}]}
    assert counts == {kind: 1}


def test_a_key_name_spelled_with_the_kelvin_sign_is_still_redacted() -> None:
    # "\u212a".lower() == "k": the rule (case-insensitive) matches it, so the
    # look for secrets in the document's ASCII JSON text must not skip it.
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    cleaned, counts = redact({"notes": [f"aws_secret_access_\u212aey = {secret}"]})
    assert cleaned == {"notes": ["aws_secret_access_\u212aey = [REDACTED:aws_secret_access_key]"]}
    assert counts == {"aws_secret_access_key": 1}


@pytest.mark.parametrize("text", ["see ?pa\u017f\u017fword=hunter2", "see ?PA\u017f\u017f=hunter2"])
def test_a_long_s_is_an_s_to_the_quick_look_for_secrets(text: str) -> None:
    """LONG S is "s" to a case-insensitive rule though its lower case is not:
    the quick look for secrets must not skip it, in a text or in a
    document's ASCII JSON."""
    cleaned = text.split("=")[0] + "=[REDACTED:url_password]"
    assert redact_text(text) == (cleaned, {"url_password": 1})
    assert redact({"notes": [text]}) == ({"notes": [cleaned]}, {"url_password": 1})


def test_the_callers_json_text_spares_dumping_again() -> None:
    document = {"message": "nothing secret here"}
    assert redact(document, ascii_json='{"message": "nothing secret here"}') == (document, {})
    # The text is what is searched: a caller's text naming a trigger walks the value.
    assert redact({"m": OPENAI}, ascii_json='{"m": "sk-"}') == (
        {"m": "[REDACTED:openai_api_key]"},
        {"openai_api_key": 1},
    )
