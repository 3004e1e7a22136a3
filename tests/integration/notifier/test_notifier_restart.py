"""Issue 5's test: an escalation reaches the webhook receiver exactly once per id even when
the first delivery fails and the notifier is restarted; the record shows it delivered.

The notifier runs as a subprocess (`python -m services.notifier`, configured by `NOTIFIER_*`
variables) against the session's nats-server, and is killed mid-retry with SIGTERM or
SIGKILL while the receiver answers 500; a new process then delivers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dispatch_nats import Layout, RecordStore
from tests.integration.notifier.support import (
    Receiver,
    create_job,
    delivered_events,
    escalate,
    new_job_id,
    read_job,
    undelivered,
)
from tests.servers.nats import NatsServer
from tests.util import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[3]


class NotifierProcess:
    """`python -m services.notifier` with its JSON log lines in a file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env, self.log_path = env, log_path
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "services.notifier",
                cwd=REPO,
                env=self.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    async def ready(self) -> None:
        def started() -> None:
            assert self.proc is not None
            assert self.proc.returncode is None, f"exited: {self.log_path.read_text()[-2000:]}"
            assert any(e.get("event") == "consumer.started" for e in self.events())

        await assert_eventually(started, timeout_s=30)

    async def kill(self, sig: signal.Signals) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), 30)


@pytest.fixture
async def spawn(
    nats_server: NatsServer, layout: Layout, tmp_path: Path
) -> AsyncIterator[list[NotifierProcess]]:
    """A list to append started notifier processes to; any still running are killed."""
    procs: list[NotifierProcess] = []
    yield procs
    for p in procs:
        if p.proc is not None and p.proc.returncode is None:
            p.proc.kill()
            await p.proc.wait()


def _env(nats_server: NatsServer, layout: Layout, webhook_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    env.update(
        NOTIFIER_NATS_URL=nats_server.url,
        NOTIFIER_NAMESPACE=layout.namespace,
        NOTIFIER_HTTP_PORT="0",
        NOTIFIER_WEBHOOK_URL=webhook_url,
        NOTIFIER_RETRY_BASE_S="0.2",
        NOTIFIER_RETRY_MAX_S="0.5",
        NOTIFIER_ACK_WAIT_S="2",
        NOTIFIER_SHUTDOWN_GRACE_S="5",
        NOTIFIER_AUDIT_INTERVAL_S="0.5",
        PYTHONUNBUFFERED="1",
        # This checkout's packages, not those the venv was installed from (a worktree).
        PYTHONPATH=f"{REPO / 'libs'}{os.pathsep}{REPO}",
    )
    return env


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_exactly_once_per_id_across_a_restart_mid_retry(
    nats_server: NatsServer,
    layout: Layout,
    store: RecordStore,
    receiver: Receiver,
    spawn: list[NotifierProcess],
    tmp_path: Path,
    sig: signal.Signals,
) -> None:
    env = _env(nats_server, layout, receiver.url("/hook"))
    receiver.down = True  # every delivery fails until the first notifier is gone

    a, b = new_job_id(), new_job_id()
    for job in (a, b):
        await create_job(store, job)
    await escalate(store, a, "failed:preempted")  # committed before any notifier runs
    await escalate(store, b, "overdue:1")

    first = NotifierProcess(env, tmp_path / "first.log")
    spawn.append(first)
    await first.start()
    await first.ready()
    await escalate(store, b, "cleanup-deadline")  # committed while it runs
    ids = {f"{a}:failed:preempted", f"{b}:overdue:1", f"{b}:cleanup-deadline"}

    def each_failed_twice() -> None:  # so the first notifier is retrying when it's killed
        keys = Counter(r.headers["Idempotency-Key"] for r in receiver.requests)
        assert set(keys) == ids
        assert min(keys.values()) >= 2
        assert not receiver.accepted()

    await assert_eventually(each_failed_twice, timeout_s=30)
    code = await first.kill(sig)
    assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    for job in (a, b):
        assert undelivered(await read_job(store, job))  # nothing recorded while failing

    receiver.down = False
    second = NotifierProcess(env, tmp_path / "second.log")
    spawn.append(second)
    await second.start()

    async def all_delivered() -> None:
        for job in (a, b):
            assert undelivered(await read_job(store, job)) == []

    await assert_eventually(all_delivered, timeout_s=30)
    accepted = Counter(r.headers["Idempotency-Key"] for r in receiver.accepted())
    assert accepted == dict.fromkeys(ids, 1)
    recorded = [(e.id, e.channel) for job in (a, b) for _, e in await delivered_events(store, job)]
    assert sorted(recorded) == [
        ("cleanup-deadline", "webhook"),
        ("failed:preempted", "webhook"),
        ("overdue:1", "webhook"),
    ]
    assert await second.kill(signal.SIGTERM) == 0

    # A third start finds everything recorded: it sends only what is new.
    seen = len(receiver.requests)
    third = NotifierProcess(env, tmp_path / "third.log")
    spawn.append(third)
    await third.start()
    await third.ready()
    await escalate(store, a, "give-up")

    def sentinel() -> None:
        assert [r.esc_id for r in receiver.requests[seen:]] == ["give-up"]

    await assert_eventually(sentinel, timeout_s=30)
    assert await third.kill(signal.SIGTERM) == 0
    assert [r.esc_id for r in receiver.requests[seen:]] == ["give-up"]
    catch_up = [e for e in third.events() if e.get("event") == "notifier.catch_up"]
    assert catch_up
    assert catch_up[0]["undelivered"] in (0, 1)  # the sentinel may already be committed


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"NOTIFIER_RETRY_BASE_SECONDS": "1"}, b"NOTIFIER_RETRY_BASE_SECONDS"),
        ({"NOTIFIER_ROUTES": "failed:*=pager"}, b"no channel named 'pager'"),
    ],
    ids=["unknown-variable", "unknown-channel"],
)
async def test_bad_configuration_exits_with_status_2_naming_it(
    env: dict[str, str], named: bytes
) -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    full.update(
        env,
        NOTIFIER_NATS_URL="nats://127.0.0.1:1",
        NOTIFIER_HTTP_PORT="0",
        PYTHONPATH=f"{REPO / 'libs'}{os.pathsep}{REPO}",
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.notifier",
        cwd=REPO,
        env=full,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2, err
    assert named in err
