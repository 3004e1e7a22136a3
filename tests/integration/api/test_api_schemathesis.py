"""schemathesis against the live API: ``python -m services.api`` as a process on a real
nats-server, every operation of its own OpenAPI document (the SSE stream aside: it never
ends by itself), bounded by ``max_examples``. No answer may be a 5xx, every answer must be
documented and match its schema, and the process must still be up and healthy at the end
having logged no failed request.

Cases that name a job use, one in three each, a job that exists (running, or cancelled), so
commands are decided against real records rather than only answered 404.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import APIOperation, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from services.api.openapi import build_openapi
from tests.integration.api.conftest import TOKENS_TOML
from tests.integration.api.support import HUMAN_TOKEN, SPEC
from tests.servers.nats import NatsServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
AUTH = {"Authorization": f"Bearer {HUMAN_TOKEN}"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@dataclass
class LiveApi:
    """The API process and what the test needs of it."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path
    jobs: tuple[str, ...]
    cases: int = 0


def _wait_for_port(process: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the API exited with {process.returncode}:\n{log.read_text()}")
        for line in log.read_text().splitlines():
            if '"api.listening"' in line:
                return int(json.loads(line)["port"])
        time.sleep(0.05)
    raise AssertionError(f"the API did not listen within {timeout_s} s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def live_api(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveApi]:
    """``python -m services.api`` on a free port, with two jobs in its records."""
    tmp = tmp_path_factory.mktemp("api-live")
    tokens = tmp / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    clusters = tmp / "clusters.toml"
    clusters.write_text(
        f'[[clusters]]\nname = "local"\nbackend = "local"\ndata_dir = "{tmp / "local"}"\n'
    )
    log = tmp / "api.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("API_")}
    env = {
        **clean,
        "PYTHONPATH": f"{ROOT}/libs:{ROOT}",
        "API_NATS_URL": nats_server.url,
        "API_NAMESPACE": f"t{uuid.uuid4().hex[:12]}",
        "API_HTTP_PORT": "0",
        "API_TOKENS_FILE": str(tokens),
        "API_CLUSTERS_FILE": str(clusters),
        "API_LOG_LEVEL": "info",
    }
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.api"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{_wait_for_port(process, log)}"
        running = requests.post(f"{url}/v1/jobs", json={"spec": SPEC}, headers=AUTH, timeout=10)
        cancelled = requests.post(f"{url}/v1/jobs", json={"spec": SPEC}, headers=AUTH, timeout=10)
        assert running.status_code == cancelled.status_code == 201
        done = cancelled.json()["job_id"]
        cancel = requests.post(
            f"{url}/v1/jobs/{done}/cancel", json={"reason": "seed"}, headers=AUTH, timeout=10
        )
        assert cancel.status_code == 200
        yield LiveApi(url, process, log, (running.json()["job_id"], done))
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# The same document the API serves (built by the same function for the same clusters; a test
# below checks they are equal), loaded at collection so each operation is its own test.
DOCUMENT = build_openapi(["local"])
OPERATIONS = [
    result.ok()
    for result in schemathesis.openapi.from_dict(DOCUMENT)
    .exclude(path="/v1/jobs/{job}/stream")
    .get_all_operations()
    if isinstance(result, Ok)
]


def test_the_served_document_is_the_one_tested(live_api: LiveApi) -> None:
    served = requests.get(f"{live_api.url}/openapi.json", timeout=10).json()
    assert served == DOCUMENT


# Negative cases (invalid data) exist only for operations that take some input.
CASES = [
    pytest.param(op, mode, id=f"{op.label} {mode.value}")
    for op in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE
    or any(len(p) for p in (op.path_parameters, op.query, op.headers, op.body))
]


@pytest.mark.parametrize(("operation", "mode"), CASES)
def test_no_server_error_and_every_answer_documented(
    live_api: LiveApi, operation: APIOperation[Any, Any, Any, Any], mode: GenerationMode
) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: schemathesis.Case[Any]) -> None:
        params = case.path_parameters
        if params and "job" in params:
            pick = zlib.crc32(repr((case.body, params)).encode()) % 3
            if pick < len(live_api.jobs):
                params["job"] = live_api.jobs[pick]
        if case.query.get("follow") == "true":
            # GET /logs?follow=true waits for the job's first launch (no supervisor here):
            # like the SSE stream, it doesn't end by itself
            case.query["follow"] = "false"
        live_api.cases += 1
        case.call_and_validate(base_url=live_api.url, headers=AUTH, checks=CHECKS, timeout=30)

    check()


def test_the_api_survived(live_api: LiveApi) -> None:
    """Runs after the schemathesis cases (file order): the process is up, healthy, and
    logged no failed request."""
    assert live_api.process.poll() is None, live_api.log.read_text()
    health = requests.get(f"{live_api.url}/healthz", timeout=10)
    assert health.status_code == 200
    metrics = requests.get(f"{live_api.url}/metrics", timeout=10).text
    assert 'status="500"' not in metrics
    answers: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "dispatch_api_requests_total":
                status = sample.labels["status"]
                answers[status] = answers.get(status, 0) + sample.value
    print("answers by status:", dict(sorted(answers.items())))
    assert not any(status.startswith("5") for status in answers)
    if live_api.cases > 300:
        # The whole module ran: the cases reached deep (created jobs, refused commands).
        for status in ("200", "201", "400", "404", "409"):
            assert answers.get(status, 0) > 0, status
    log = live_api.log.read_text()
    assert "request.failed" not in log
    assert '"level": "error"' not in log
    live_api.process.send_signal(signal.SIGTERM)
    assert live_api.process.wait(30) == 0
