"""Secret literal detection: keys, value prefixes, handles — both sides of every rule."""

from __future__ import annotations

import pytest

from processors.engine.secrets import find_secret_literals, is_secret_handle, is_secret_key, is_secret_value


@pytest.mark.parametrize(
    "key",
    [
        "secret",
        "Secrets",
        "token",
        "password",
        "PASSWD",
        "credentials",
        "api_key",
        "apiKey",
        "X-Api-Key",
        "apikey",
        "access_key",
        "accessToken",
        "secret-key",
        "private_key",
        "client_secret",
        "auth_token",
        "Authorization",
        "github.token",
        "db_password",
    ],
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "max_tokens",
        "tokens_used",
        "token_count",
        "maxTokens",
        "tokenizer",
        "secret_name",
        "password_ref",
        "prompt_tokens",
        "completion_tokens",
        "keyboard",
        "api",
        "monkey",
        "author",
        "secretary",
        "topic",
        "token_limit",
        "api_key_id",
    ],
)
def test_not_secret_keys(key: str) -> None:
    assert not is_secret_key(key)


@pytest.mark.parametrize(
    "value",
    [
        "capability://vault/x",
        "Bearer abc",
        "bearer abc",
        "sk-proj-123",
        "ghp_abc",
        "github_pat_11A",
        "xoxb-123",
        "AKIAABCDEFGHIJKLMNOP",
        "-----BEGIN RSA PRIVATE KEY-----\nMII",
    ],
)
def test_secret_values(value: str) -> None:
    assert is_secret_value(value)


@pytest.mark.parametrize(
    "value", ["", "hello", "a Bearer b", "task-1", "ghp", "AKIA", "skip-this", "capability"]
)
def test_not_secret_values(value: str) -> None:
    assert not is_secret_value(value)


def test_find_secret_literals_paths() -> None:
    doc = {
        "headers": {"Authorization": "Basic dXNlcjpwYXNz", "Accept": "json"},
        "args": [{"token": "abc"}, {"token": {"$secret": "gh"}}, {"token": None}, {"token": ""}],
        "config": {"password": 1234, "secret_enabled": True, "max_tokens": 100},
        "nested": [["Bearer zzz"]],
        "ref": {"api_key": {"from": "input", "pointer": "/key"}},
        "lit": {"from": "literal", "value": {"password": "p"}},
        "schema": {"properties": {"password": {"type": "string"}}},
    }
    assert find_secret_literals(doc, "in") == [
        "in.headers.Authorization",
        "in.args[0].token",
        "in.config.password",
        "in.nested[0][0]",
        "in.lit.value.password",
    ]


def test_secret_handles() -> None:
    assert is_secret_handle({"$secret": "github"})
    assert not is_secret_handle({"$secret": ""})
    assert not is_secret_handle({"$secret": "a", "extra": 1})
    # a malformed handle is not a handle: its `$secret` value sits under a secret key
    assert find_secret_literals({"k": {"$secret": "a", "extra": "sk-1"}}) == ["k.$secret", "k.extra"]
    assert find_secret_literals({"api_key": {"$secret": "a"}}) == []


def test_list_under_secret_key_is_flagged_per_item() -> None:
    assert find_secret_literals({"tokens": ["a"], "token": ["a", None]}) == ["token[0]"]
