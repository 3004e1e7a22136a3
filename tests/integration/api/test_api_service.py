"""The service as it runs: ``run(cfg, stop)`` in-process with the shared clusters file and a
tokens file, health and metrics, a clean stop that ends SSE streams; ``python -m
services.api`` refusing a bad configuration."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from dispatch_core import Action
from services.api.clusters import load_declarations
from services.api.config import ApiConfig
from services.api.service import run
from services.common.config import ConfigError
from tests.integration.api.support import HUMAN_TOKEN, SPEC
from tests.servers.nats import NatsServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def clusters_file(tmp_path: Path) -> Path:
    """A shared clusters file with one local cluster and one Slurm cluster."""
    path = tmp_path / "clusters.toml"
    path.write_text(
        f"""
[[clusters]]
name = "local"
backend = "local"
data_dir = "{tmp_path / "local"}"
node_loss_window_s = 45

[[clusters]]
name = "hpc"
backend = "slurm"
"""
    )
    return path


def test_declarations_come_from_the_shared_clusters_file(tmp_path: Path) -> None:
    declarations = load_declarations(clusters_file(tmp_path))
    assert list(declarations) == ["local", "hpc"]
    assert declarations["hpc"].native_actions == frozenset({Action.REQUEUE})
    local = declarations["local"]
    assert local.node_loss_window_s == 45
    assert local.emergency_stop
    assert local.cessation_signal
    assert Action.RESTART not in local.native_actions


def test_a_bad_clusters_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "clusters.json"
    path.write_text('{"clusters": [{"name": "Bad Name", "backend": "local", "data_dir": "x"}]}')
    with pytest.raises(ConfigError, match="Bad Name"):
        load_declarations(path)
    with pytest.raises(ConfigError):
        load_declarations(tmp_path / "missing.toml")


async def test_run_serves_until_stopped_and_ends_streams(
    nats_server: NatsServer, tokens_file: Path, tmp_path: Path
) -> None:
    cfg = ApiConfig(
        nats_url=(nats_server.url,),
        namespace=f"t{uuid.uuid4().hex[:12]}",
        http_port=0,
        tokens_file=str(tokens_file),
        clusters_file=str(clusters_file(tmp_path)),
        sse_heartbeat_s=0.2,
    )
    stop = asyncio.Event()
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    registry = CollectorRegistry()
    service = asyncio.create_task(run(cfg, stop, registry=registry, on_listening=port.set_result))
    url = f"http://127.0.0.1:{await asyncio.wait_for(port, 30)}"
    auth = {"Authorization": f"Bearer {HUMAN_TOKEN}"}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/healthz") as r:
            assert r.status == 200
            assert (await r.json())["service"] == "api"
        async with session.post(f"{url}/v1/jobs", json={"spec": SPEC}, headers=auth) as r:
            assert r.status == 201
            job_id = (await r.json())["job_id"]
        async with session.get(f"{url}/v1/jobs/{job_id}/record", headers=auth) as r:
            created = (await r.json())["events"][0]["event"]
            assert created["declarations"]["node_loss_window_s"] == 45
        async with session.get(f"{url}/metrics") as r:
            text = await r.text()
            assert (
                'dispatch_api_requests_total{method="POST",route="/v1/jobs",status="201"}' in text
            )
            assert 'dispatch_api_commands_total{command="submit",outcome="committed"}' in text

        async with session.get(f"{url}/v1/jobs/{job_id}/stream", headers=auth) as r:
            assert r.status == 200
            assert (await r.content.readline()).startswith(b"event: status")
            stop.set()
            async with asyncio.timeout(15):
                rest = await r.content.read()  # the server ends the stream: EOF
            assert b"event: status" not in rest or rest.endswith(b"\n\n")
    await asyncio.wait_for(service, 30)


def _main(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("API_")}
    return subprocess.run(
        [sys.executable, "-m", "services.api"],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": f"{ROOT}/libs:{ROOT}", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_main_refuses_an_unknown_variable() -> None:
    done = _main({"API_HTTP_PROT": "8080"})
    assert done.returncode == 2
    assert "API_HTTP_PROT" in done.stderr


def test_main_refuses_a_bad_value() -> None:
    done = _main({"API_HTTP_PORT": "eighty"})
    assert done.returncode == 2
    assert "API_HTTP_PORT" in done.stderr


def test_main_needs_a_tokens_file() -> None:
    done = _main({"API_LOG_JSON": "false"})
    assert done.returncode == 2
    assert "API_TOKENS_FILE" in done.stderr
