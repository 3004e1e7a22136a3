"""Authentication: bearer tokens from the tokens file; no token or a bad one is 401 on every
``/v1`` route and records nothing; health, metrics and the OpenAPI document are open."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatch_core import Actor, ActorKind
from services.api.auth import Authenticator, hash_token
from services.api.errors import Unauthorized
from services.common.config import ConfigError
from tests.integration.api.support import HUMAN_TOKEN, SPEC, Api

pytestmark = pytest.mark.integration

ROUTES = [
    ("POST", "/v1/jobs", {"spec": SPEC}),
    ("GET", "/v1/jobs", None),
    ("GET", "/v1/jobs/{job}", None),
    ("GET", "/v1/jobs/{job}/record", None),
    ("GET", "/v1/jobs/{job}/stream", None),
    ("GET", "/v1/escalations", None),
    ("POST", "/v1/jobs/{job}/hold", {"reason": "r"}),
    ("POST", "/v1/jobs/{job}/release", {"reason": "r"}),
    ("POST", "/v1/jobs/{job}/resubmit", {"reason": "r"}),
    ("POST", "/v1/jobs/{job}/cancel", {"reason": "r"}),
    ("POST", "/v1/jobs/{job}/give-up", {"reason": "r"}),
    ("POST", "/v1/jobs/{job}/abandon", {"reason": "r", "target": {"submission": 1}}),
    ("POST", "/v1/jobs/{job}/supersede", {"reason": "r"}),
    ("POST", "/v1/jobs/{job}/emergency-stop", {"reason": "r"}),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer not-a-token", f"Basic {HUMAN_TOKEN}", "Bearer", f"Token {HUMAN_TOKEN}"],
)
async def test_no_or_a_bad_token_is_401_and_nothing_is_recorded(
    api: Api, method: str, path: str, body: object, authorization: str | None
) -> None:
    job_id = (await api.submit())["job_id"]
    headers = {"Authorization": authorization} if authorization else {}
    reply = await api.call(method, path.format(job=job_id), token=None, body=body, headers=headers)
    assert reply.status == 401, reply.text
    assert reply.error["code"] == "unauthorized"
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert await api.records.list_jobs() == [job_id]
    assert len(await api.events(job_id)) == 1


@pytest.mark.parametrize("path", ["/healthz", "/metrics", "/openapi.json"])
async def test_open_routes_need_no_token(api: Api, path: str) -> None:
    reply = await api.call("GET", path, token=None)
    assert reply.status == 200


async def test_the_scheme_is_case_insensitive(api: Api) -> None:
    reply = await api.call(
        "GET", "/v1/jobs", token=None, headers={"Authorization": f"bearer {HUMAN_TOKEN}"}
    )
    assert reply.status == 200


def test_tokens_file_in_json_with_hashed_and_clear_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(
        json.dumps(
            {
                "tokens": [
                    {"actor": "alice", "kind": "human", "sha256": hash_token("a").upper()},
                    {"actor": "alice", "kind": "human", "token": "a2"},
                    {"actor": "ci", "kind": "service", "token": "c"},
                ]
            }
        )
    )
    auth = Authenticator.from_file(path)
    assert len(auth) == 3
    assert auth.authenticate("Bearer a") == Actor(name="alice", kind=ActorKind.HUMAN)
    assert auth.authenticate("Bearer a2") == Actor(name="alice", kind=ActorKind.HUMAN)
    assert auth.authenticate("Bearer  c ") == Actor(name="ci", kind=ActorKind.SERVICE)
    with pytest.raises(Unauthorized):
        auth.authenticate("Bearer " + hash_token("a"))  # the digest is not the token


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"tokens": [{"actor": "a", "kind": "human"}]}', "exactly one of 'token' and 'sha256'"),
        (
            '{"tokens": [{"actor": "a", "kind": "human", "token": "t", "sha256": "%s"}]}'
            % ("0" * 64),
            "exactly one of",
        ),
        ('{"tokens": [{"actor": "a", "kind": "human", "sha256": "abc"}]}', "64 hex digits"),
        ('{"tokens": [{"actor": "a", "kind": "robot", "token": "t"}]}', "kind"),
        ('{"tokens": [{"actor": "a", "kind": "human", "token": "t", "x": 1}]}', "unknown field"),
        (
            '{"tokens": [{"actor": "a", "kind": "human", "token": "t"},'
            ' {"actor": "b", "kind": "human", "token": "t"}]}',
            "listed twice",
        ),
        ("{", "tokens file"),
    ],
    ids=["neither", "both", "short-digest", "bad-kind", "unknown-field", "twice", "not-json"],
)
def test_a_bad_tokens_file_is_a_config_error(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words):
        Authenticator.from_file(path)


def test_a_missing_tokens_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tokens file"):
        Authenticator.from_file(tmp_path / "missing.toml")
