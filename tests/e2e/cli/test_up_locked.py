"""``dispatch up`` is locked by default: the attacks of issue 10, replayed against a real
``dispatch up`` (its own nats-server, identities and services), are all refused by
nats-server and nothing lands in any record; and ``dispatch up --nats URL
--nats-credentials DIR`` runs jobs on a NATS it did not start, locked the same way and
requiring TLS."""

from __future__ import annotations

import asyncio
import json
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import trustme
from nats.aio.client import Client as NATS

from dispatch_core import WriterKind
from dispatch_nats import DEFAULT_LAYOUT
from dispatch_nats.permissions import TlsBlock
from tests.e2e.cli.conftest import JobFile
from tests.e2e.cli.support import Up, cli_env, run_cli
from tests.servers.locked_nats import LockedNats, connect_or_close
from tests.util import assert_eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

LAYOUT = DEFAULT_LAYOUT
RECORD = LAYOUT.record_stream


def _no_violation_logged(up: Up) -> None:
    """The services did all their work within their permissions: none logged a refusal."""
    for log in sorted((up.data_dir / "logs").glob("*.log")):
        text = log.read_text(errors="replace").lower()
        assert "permissions violation" not in text, f"{log.name}:\n{text[-3000:]}"
        assert "authorization violation" not in text, f"{log.name}:\n{text[-3000:]}"


def _submitted(up: Up, path: Path) -> str:
    result = up.dispatch("submit", str(path), "--json")
    assert result.code == 0, str(result)
    job_id: str = result.json()["job_id"]
    return job_id


async def _connect(url: str, seed: Path | None, inbox: str, errors: list[Exception]) -> NATS:
    async def error_cb(err: Exception) -> None:
        errors.append(err)

    kw: dict[str, Any] = {}
    if seed is not None:
        kw = {"nkeys_seed": str(seed), "inbox_prefix": inbox}
    return await connect_or_close(
        servers=[url],
        error_cb=error_cb,
        connect_timeout=2,
        allow_reconnect=False,
        max_reconnect_attempts=1,  # nats-py: 0 retries the first connect for ever
        reconnect_time_wait=0.1,
        **kw,
    )


async def _record_state(url: str, identities: Path) -> dict[str, Any]:
    """The record stream's state, read with the read-only ``reader`` identity."""
    nc = await _connect(url, identities / "reader.nk", "_INBOX.reader", [])
    try:
        reply = await nc.request(f"{LAYOUT.api_prefix}.STREAM.INFO.{RECORD}", b"", timeout=10)
        state: dict[str, Any] = json.loads(reply.data)["state"]
        return state
    finally:
        await nc.close()


async def _first_event(url: str, identities: Path, job_id: str) -> dict[str, Any]:
    nc = await _connect(url, identities / "reader.nk", "_INBOX.reader", [])
    try:
        body = json.dumps({"last_by_subj": LAYOUT.record_subject(job_id, WriterKind.API)})
        msg = await nc.request(
            f"{LAYOUT.api_prefix}.DIRECT.GET.{RECORD}", body.encode(), timeout=10
        )
        event: dict[str, Any] = json.loads(msg.data)
        return event
    finally:
        await nc.close()


async def _attacks(url: str, identities: Path, victim: str, evil_flag: Path) -> list[str]:
    """The issue's attacks; return what the server refused (each must be)."""
    # 1. a local process with nothing but the loopback URL
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization"):
        await _connect(url, None, "", [])
    refused = ["anonymous connection"]
    # 2-4. with the notifier's own identity (a compromised notifier)
    created = await _first_event(url, identities, victim)
    evil = f"evil-{uuid.uuid4().hex[:8]}"
    created.update(job_id=evil)
    created["spec"]["command"] = ["/bin/sh", "-c", f"touch {evil_flag}"]
    cancel = {
        "type": "cancel.requested",
        "job_id": victim,
        "at": created["at"],
        "by": {"kind": "human", "name": "someone-who-never-asked"},
        "reason": "spoofed",
    }
    errors: list[Exception] = []
    nc = await _connect(url, identities / "notifier.nk", "_INBOX.notifier", errors)
    attempts = [
        (LAYOUT.record_subject(evil, WriterKind.API), created),
        (LAYOUT.record_subject(evil, WriterKind.SUPERVISOR), created),
        (LAYOUT.record_subject(victim, WriterKind.API), cancel),
        (LAYOUT.record_subject(victim, WriterKind.SUPERVISOR), cancel),
        (f"{LAYOUT.api_prefix}.STREAM.DELETE.{RECORD}", None),
        (f"{LAYOUT.api_prefix}.STREAM.PURGE.{RECORD}", None),
        (f"{LAYOUT.api_prefix}.STREAM.MSG.DELETE.{RECORD}", {"seq": 1}),
    ]
    try:
        for subject, body in attempts:
            payload = json.dumps(body).encode() if body is not None else b""
            await nc.publish(
                subject, payload, reply=nc.new_inbox(), headers={"Nats-Msg-Id": uuid.uuid4().hex}
            )
            await nc.flush()
            needle = f'permissions violation for publish to "{subject.lower()}"'

            def seen(needle: str = needle) -> None:
                assert any(needle in str(e).lower() for e in errors), f"{needle} not refused"

            await assert_eventually(seen, timeout_s=15)
            refused.append(subject)
    finally:
        await nc.close()
    return refused


def test_up_refuses_the_four_attacks_and_nothing_lands(tmp_path: Path, job_file: JobFile) -> None:
    up = Up(tmp_path / "data")
    up.start()
    try:
        identities = up.data_dir / "nats-identities"
        state = json.loads((up.data_dir / "up.json").read_text())
        url = state["nats_url"]
        assert url.startswith("nats://127.0.0.1:"), url
        # the identities: one per service, 0600, and none of them printed or in argv
        seeds = sorted(identities.glob("*.nk"))
        assert {p.stem for p in seeds} == {
            "api",
            "supervisor",
            "notifier",
            "observer-local",
            "reader",
        }
        out = up.output()
        for seed in seeds:
            assert stat.S_IMODE(seed.stat().st_mode) == 0o600, seed
            assert seed.read_text().strip() not in out
        config = (up.data_dir / "nats.conf").read_text()
        assert "no_auth_user" not in config
        assert "http" not in config  # no monitoring port
        for seed in seeds:
            assert seed.read_text().strip() not in config

        victim = _submitted(up, job_file("echo hello"))
        up.wait_status(victim, lambda s: s["state"] == "succeeded")
        _no_violation_logged(up)
        before = asyncio.run(_record_state(url, identities))
        evil_flag = tmp_path / "pwned"
        refused = asyncio.run(_attacks(url, identities, victim, evil_flag))
        assert len(refused) == 8, refused
        after = asyncio.run(_record_state(url, identities))
        assert after["messages"] == before["messages"], (before, after)
        assert after["last_seq"] == before["last_seq"], (before, after)
        # the services never saw any of it: the victim is as it was, the evil job unknown
        assert up.status(victim)["state"] == "succeeded"
        assert up.dispatch("escalations", "--all").code == 0
        assert not evil_flag.exists()
    finally:
        up.close()


def test_up_on_an_existing_locked_nats_runs_a_job(tmp_path: Path, job_file: JobFile) -> None:
    """The site's NATS requires TLS (a CA made here) and the services' identities; DIR holds
    one seed per service and ``ca.pem``. A job submitted through the API runs to succeeded."""
    ca = trustme.CA()
    pki = tmp_path / "pki"
    pki.mkdir()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    leaf.cert_chain_pems[0].write_to_path(str(pki / "server.pem"))
    leaf.private_key_pem.write_to_path(str(pki / "server-key.pem"))
    tls = TlsBlock(cert_file=str(pki / "server.pem"), key_file=str(pki / "server-key.pem"))
    site = LockedNats(tmp_path / "site", clusters=("local",), tls=tls)
    site.start()
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    for name in ("api", "supervisor", "notifier", "observer-local"):
        shutil.copy2(site.seed(name), creds / f"{name}.nk")
    ca.cert_pem.write_to_path(str(creds / "ca.pem"))
    try:
        up = Up(tmp_path / "data", args=("--nats", site.url, "--nats-credentials", str(creds)))
        up.start()
        try:
            out = up.output()
            assert "starting nats-server" not in out, out
            assert f"using NATS at {site.url} with the credentials in {creds}" in out, out
            assert json.loads((up.data_dir / "up.json").read_text())["nats_url"] == site.url
            assert not (up.data_dir / "nats-identities").exists()
            for seed in creds.glob("*.nk"):
                assert seed.read_text().strip() not in out
            job = _submitted(up, job_file("echo hello from an existing nats"))
            status = up.wait_status(job, lambda s: s["state"] == "succeeded", timeout_s=120)
            assert status["cause"]["kind"] == "none", status
            _no_violation_logged(up)
        finally:
            up.close()
    finally:
        site.stop()


def test_up_names_the_missing_credentials(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "api.nk").write_text("not used: the others are missing\n")
    result = run_cli(
        "up",
        "--data-dir",
        str(tmp_path / "data"),
        "--port",
        "0",
        "--nats",
        "nats://127.0.0.1:1",
        "--nats-credentials",
        str(creds),
        env=cli_env(),
    )
    assert result.code == 1, str(result)
    assert "has no credential for supervisor, notifier, observer-local" in result.err, str(result)
    assert "<identity>.nk" in result.err, str(result)
    alone = run_cli(
        "up", "--data-dir", str(tmp_path / "data"), "--nats", "nats://h:1", env=cli_env()
    )
    assert alone.code == 2, str(alone)
    assert "--nats and --nats-credentials go together" in alone.err, str(alone)
