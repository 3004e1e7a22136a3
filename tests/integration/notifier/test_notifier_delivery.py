"""The notifier against a real nats-server, a real HTTP receiver and a real SMTP sink.

Escalations are committed to job records through the record store with the core's events;
the notifier runs in-process (`start_notifier`); what it sent is what the receivers got.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import logging
import socket
from datetime import datetime
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from dispatch_core import EscalationDelivered
from dispatch_nats import RecordStore
from services.notifier.config import NotifierConfig
from services.notifier.service import run
from tests.integration.notifier.conftest import StartNotifier
from tests.integration.notifier.support import (
    Receiver,
    SmtpSink,
    append,
    create_job,
    delivered_events,
    escalate,
    new_job_id,
    read_job,
    undelivered,
)
from tests.util import assert_eventually

pytestmark = pytest.mark.integration


async def _all_delivered(store: RecordStore, *job_ids: str) -> None:
    for job_id in job_ids:
        job = await read_job(store, job_id)
        assert job.escalations, f"{job_id}: no escalations"
        assert undelivered(job) == [], f"{job_id}: undelivered {undelivered(job)}"


async def test_webhook_delivery_is_recorded(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier
) -> None:
    notifier = await start_notifier(
        webhook_url=receiver.url("/hook"), api_url="http://api.test:8080/"
    )
    job = new_job_id()
    await create_job(store, job)
    await escalate(store, job, "failed:preempted", "preempted by a higher-priority job")

    await assert_eventually(lambda: _all_delivered(store, job))
    [req] = receiver.requests
    assert req.accepted
    assert req.path == "/hook"
    assert req.headers["Content-Type"] == "application/json"
    assert req.headers["Idempotency-Key"] == f"{job}:failed:preempted"
    assert req.headers["X-Dispatch-Escalation-Id"] == "failed:preempted"
    assert req.headers["X-Dispatch-Job"] == job
    assert "X-Dispatch-Signature" not in req.headers
    body = req.json
    assert body["job"] == job
    assert body["id"] == "failed:preempted"
    assert body["detail"] == "preempted by a higher-priority job"
    assert body["severity"] == "critical"
    assert body["key"] == f"{job}:failed:preempted"
    assert body["link"] == f"http://api.test:8080/v1/jobs/{job}"
    assert body["page"] == f"http://api.test:8080/#/job/{job}"  # the web page, for people
    esc = (await read_job(store, job)).escalations[0]
    assert datetime.fromisoformat(body["at"]) == esc.at

    [(entry, event)] = await delivered_events(store, job)
    assert event.id == "failed:preempted"
    assert event.channel == "webhook"
    assert entry.msg_id == f"delivered:{job}:failed:preempted"

    assert (
        notifier.metric("dispatch_notifier_deliveries_total", channel="webhook", outcome="accepted")
        == 1
    )
    assert notifier.metric("dispatch_notifier_recorded_total", by="self") == 1

    async def gauge_clear() -> None:
        assert notifier.metric("dispatch_notifier_undelivered") == 0
        assert notifier.metric("dispatch_notifier_oldest_undelivered_age_seconds") == 0

    await assert_eventually(gauge_clear)


async def test_webhook_is_signed_with_hmac_when_a_secret_is_set(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier
) -> None:
    await start_notifier(webhook_url=receiver.url("/hook"), webhook_secret="s3cret")
    job = new_job_id()
    await create_job(store, job)
    await escalate(store, job, "give-up")

    await assert_eventually(lambda: _all_delivered(store, job))
    [req] = receiver.requests
    expected = hmac.new(b"s3cret", req.body, hashlib.sha256).hexdigest()
    assert req.headers["X-Dispatch-Signature"] == f"sha256={expected}"
    assert "link" not in req.json  # no API URL configured


@pytest.mark.parametrize("blocks", [False, True])
async def test_slack_payload_shape(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier, blocks: bool
) -> None:
    await start_notifier(
        slack_url=receiver.url("/slack"), slack_blocks=blocks, api_url="http://api.test"
    )
    job = new_job_id()
    await create_job(store, job)
    await escalate(store, job, "overdue:3", "hold 3 is past its deadline <by 2h> & counting")

    await assert_eventually(lambda: _all_delivered(store, job))
    [req] = receiver.requests
    payload = req.json
    assert set(payload) == ({"text", "blocks"} if blocks else {"text"})
    text = payload["text"]
    assert job in text
    assert "`overdue:3`" in text
    assert "&lt;by 2h&gt; &amp; counting" in text  # Slack's escaping of <, > and &
    assert f"<http://api.test/#/job/{job}|open>" in text
    if blocks:
        kinds = [b["type"] for b in payload["blocks"]]
        assert kinds == ["section", "section", "context"]
        assert payload["blocks"][0]["text"]["type"] == "mrkdwn"
        assert "Release" in payload["blocks"][2]["elements"][0]["text"]  # the hint
    assert req.headers["Idempotency-Key"] == f"{job}:overdue:3"
    [(_, event)] = await delivered_events(store, job)
    assert event.channel == "slack"


async def test_email_arrives_at_the_smtp_sink(
    store: RecordStore, smtp_sink: SmtpSink, start_notifier: StartNotifier
) -> None:
    await start_notifier(
        smtp_host="127.0.0.1",
        smtp_port=smtp_sink.port,
        smtp_from="dispatch@example.test",
        smtp_to=["oncall@example.test", "ml@example.test"],
        api_url="http://api.test",
    )
    job = new_job_id()
    await create_job(store, job)
    await escalate(store, job, "cleanup-deadline", "still alive: dj-x (local/123)")

    await assert_eventually(lambda: _all_delivered(store, job))
    [msg] = smtp_sink.messages
    assert smtp_sink.envelopes == [
        ("dispatch@example.test", ["oncall@example.test", "ml@example.test"])
    ]
    assert msg["Subject"] == f"[dispatch] critical: job {job}: cleanup-deadline"
    assert msg["From"] == "dispatch@example.test"
    assert msg["X-Dispatch-Escalation-Id"] == "cleanup-deadline"
    assert msg["X-Dispatch-Job"] == job
    assert msg["Message-ID"].endswith("@example.test>")
    body = msg.get_content()
    assert f"dispatch job {job} needs a decision: cleanup-deadline" in body
    assert "still alive: dj-x (local/123)" in body
    assert f"http://api.test/#/job/{job}" in body
    assert f"{job}:cleanup-deadline" in body
    [(_, event)] = await delivered_events(store, job)
    assert event.channel == "email"


async def test_routing_by_id_prefix(
    store: RecordStore,
    receiver: Receiver,
    smtp_sink: SmtpSink,
    start_notifier: StartNotifier,
) -> None:
    await start_notifier(
        webhook_url=receiver.url("/hook"),
        slack_url=receiver.url("/slack"),
        smtp_host="127.0.0.1",
        smtp_port=smtp_sink.port,
        smtp_to=["oncall@example.test"],
        routes=["failed:*|cleanup-deadline=email+slack", "overdue:*=slack", "*=webhook"],
    )
    job = new_job_id()
    await create_job(store, job)
    for esc_id in ("failed:preempted", "overdue:3", "give-up", "all-unknown:2"):
        await escalate(store, job, esc_id)

    await assert_eventually(lambda: _all_delivered(store, job))
    assert sorted(m["X-Dispatch-Escalation-Id"] for m in smtp_sink.messages) == ["failed:preempted"]
    assert sorted(r.esc_id for r in receiver.on("/slack")) == ["failed:preempted", "overdue:3"]
    assert sorted(r.esc_id for r in receiver.on("/hook")) == ["all-unknown:2", "give-up"]
    channels = {e.id: e.channel for _, e in await delivered_events(store, job)}
    assert channels == {
        "failed:preempted": "email,slack",
        "overdue:3": "slack",
        "give-up": "webhook",
        "all-unknown:2": "webhook",
    }


async def test_routes_file_by_severity_with_a_named_channel(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier, tmp_path: Path
) -> None:
    routes = tmp_path / "routes.toml"
    routes.write_text(
        f"""
default = ["webhook"]

[channels.oncall]
type = "webhook"
url = "{receiver.url("/oncall")}"
headers = {{ Authorization = "Bearer t0ken" }}

[severity]
"admin-held:*" = "critical"

[[routes]]
severities = ["critical"]
channels = ["oncall"]
"""
    )
    await start_notifier(webhook_url=receiver.url("/hook"), routes_file=str(routes))
    job = new_job_id()
    await create_job(store, job)
    for esc_id in ("refused:1", "admin-held:dj-x", "overdue:1"):
        await escalate(store, job, esc_id)

    await assert_eventually(lambda: _all_delivered(store, job))
    oncall = receiver.on("/oncall")
    assert sorted(r.esc_id for r in oncall) == ["admin-held:dj-x", "refused:1"]
    assert {r.headers["Authorization"] for r in oncall} == {"Bearer t0ken"}
    assert {r.json["severity"] for r in oncall} == {"critical"}
    assert [r.esc_id for r in receiver.on("/hook")] == ["overdue:1"]


async def test_failed_deliveries_are_retried_with_backoff(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier
) -> None:
    receiver.fail_first = 3
    notifier = await start_notifier(
        webhook_url=receiver.url("/hook"), retry_base_s=0.2, retry_max_s=2.0, retry_jitter=0.5
    )  # the injected jitter is 0: delays of exactly 0.2, 0.4, 0.8 s
    job = new_job_id()
    await create_job(store, job)
    await escalate(store, job, "foreign:dj-x-1")

    await assert_eventually(lambda: _all_delivered(store, job))
    assert [r.status for r in receiver.requests] == [500, 500, 500, 200]
    arrivals = [r.at for r in receiver.requests]
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    for gap, delay in zip(gaps, [0.2, 0.4, 0.8], strict=True):
        assert gap >= delay - 0.01, f"retried after {gap:.3f}s, backoff was {delay}s"
    assert len({r.headers["Idempotency-Key"] for r in receiver.requests}) == 1
    assert notifier.metric("dispatch_notifier_retries_total") == 3
    assert (
        notifier.metric("dispatch_notifier_deliveries_total", channel="webhook", outcome="failed")
        == 3
    )
    assert notifier.metric("dispatch_notifier_channel_consecutive_failures", channel="webhook") == 0


async def test_a_failing_channel_is_retried_until_it_accepts_and_shows_in_metrics(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier
) -> None:
    receiver.down = True
    notifier = await start_notifier(
        webhook_url=receiver.url("/hook"), retry_base_s=0.05, retry_max_s=0.2
    )
    job = new_job_id()
    await create_job(store, job)
    await escalate(store, job, "unmatched:2/1")

    def failing() -> None:
        assert len(receiver.requests) >= 6
        assert (
            notifier.metric("dispatch_notifier_channel_consecutive_failures", channel="webhook")
            >= 5
        )
        assert notifier.metric("dispatch_notifier_undelivered") == 1
        assert notifier.metric("dispatch_notifier_oldest_undelivered_age_seconds") > 0

    await assert_eventually(failing)
    assert undelivered(await read_job(store, job)) == ["unmatched:2/1"]

    receiver.down = False
    await assert_eventually(lambda: _all_delivered(store, job))
    assert receiver.accepted_ids() == {"unmatched:2/1": 1}

    async def cleared() -> None:
        assert notifier.metric("dispatch_notifier_undelivered") == 0

    await assert_eventually(cleared)


async def test_a_channel_that_fails_is_retried_alone(
    store: RecordStore,
    receiver: Receiver,
    smtp_sink: SmtpSink,
    start_notifier: StartNotifier,
) -> None:
    """With a route to two channels, the one that accepted isn't sent the escalation again
    while the other is retried; the record shows it delivered once both accepted."""
    smtp_sink.down = True
    await start_notifier(
        slack_url=receiver.url("/slack"),
        smtp_host="127.0.0.1",
        smtp_port=smtp_sink.port,
        smtp_to=["oncall@example.test"],
        routes=["failed:*=slack+email"],
        retry_base_s=0.05,
        retry_max_s=0.2,
    )
    job = new_job_id()
    await create_job(store, job)
    await escalate(store, job, "failed:oom")

    def slack_has_it() -> None:
        assert len(receiver.accepted("/slack")) == 1

    await assert_eventually(slack_has_it)
    assert undelivered(await read_job(store, job)) == ["failed:oom"]
    smtp_sink.down = False
    await assert_eventually(lambda: _all_delivered(store, job))
    assert len(smtp_sink.messages) == 1
    assert len(receiver.on("/slack")) == 1
    [(_, event)] = await delivered_events(store, job)
    assert event.channel == "slack,email"


async def test_two_replicas_do_not_double_deliver(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier
) -> None:
    receiver.delay_s = 0.02
    replicas = [
        await start_notifier(webhook_url=receiver.url("/hook"), fetch_batch=2, concurrency=4)
        for _ in range(2)
    ]
    jobs = [new_job_id() for _ in range(3)]
    expected: dict[str, int] = {}
    for job in jobs:
        await create_job(store, job)
    for n in range(4):
        for job in jobs:
            esc_id = f"overdue:{n}"
            await escalate(store, job, esc_id)
            expected[f"{job}:{esc_id}"] = 1

    await assert_eventually(lambda: _all_delivered(store, *jobs), timeout_s=30)
    keys = [r.headers["Idempotency-Key"] for r in receiver.requests]
    assert {k: keys.count(k) for k in keys} == expected
    accepted = sum(
        r.metric("dispatch_notifier_deliveries_total", channel="webhook", outcome="accepted")
        for r in replicas
    )
    assert accepted == len(expected)
    for job in jobs:
        assert len(await delivered_events(store, job)) == 4


async def test_catch_up_delivers_what_the_record_shows_undelivered_and_nothing_else(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier
) -> None:
    job, other = new_job_id(), new_job_id()
    for j in (job, other):
        await create_job(store, j)
    await escalate(store, job, "overdue:1")
    old = await read_job(store, job)
    await append(
        store,
        EscalationDelivered(job_id=job, at=old.escalations[0].at, id="overdue:1", channel=""),
    )  # delivered by a supervisor's own deliver function, before any notifier ran
    await escalate(store, job, "overdue:2")
    await escalate(store, other, "failed:node-lost")

    notifier = await start_notifier(webhook_url=receiver.url("/hook"))
    await assert_eventually(lambda: _all_delivered(store, job, other))
    await notifier.stop()  # every message handled (or handed back) before it returns
    assert sorted(r.esc_id for r in receiver.requests) == ["failed:node-lost", "overdue:2"]
    assert notifier.metric("dispatch_notifier_recorded_total", by="self") == 2


async def test_terminal_channel_when_no_channel_is_configured(
    store: RecordStore,
    start_notifier: StartNotifier,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    log_file = tmp_path / "logs" / "escalations.log"
    await start_notifier(log_file=str(log_file), api_url="http://127.0.0.1:8080")
    job = new_job_id()
    await create_job(store, job)
    await escalate(store, job, "all-unknown:2", "launch 2 unknown\nfor 10 minutes")
    await escalate(store, job, "give-up")

    await assert_eventually(lambda: _all_delivered(store, job))
    lines = log_file.read_text().splitlines()
    assert len(lines) == 2
    first = next(line for line in lines if "all-unknown:2" in line)
    assert f"[warning] dispatch job {job}: all-unknown:2: launch 2 unknown for 10 minutes" in first
    assert f"(http://127.0.0.1:8080/#/job/{job})" in first
    assert first.startswith("ESCALATION "), first  # a notice would say NOTICE
    err = capsys.readouterr().err
    assert first in err
    channels = {e.channel for _, e in await delivered_events(store, job)}
    assert channels == {"terminal"}


async def test_health_and_metrics_endpoints(
    store: RecordStore,
    receiver: Receiver,
    start_notifier: StartNotifier,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dispatch.notifier")
    await start_notifier(webhook_url=receiver.url("/hook"))
    [port] = [r.__dict__["port"] for r in caplog.records if r.getMessage() == "http.listening"]
    job = new_job_id()
    await create_job(store, job)
    await escalate(store, job, "give-up")
    await assert_eventually(lambda: _all_delivered(store, job))

    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
            assert resp.status == 200
            assert (await resp.json())["service"] == "notifier"
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            text = await resp.text()
    assert 'dispatch_notifier_deliveries_total{channel="webhook",outcome="accepted"} 1.0' in text
    assert "dispatch_notifier_oldest_undelivered_age_seconds" in text


async def test_stops_promptly_while_nats_is_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dispatch.notifier")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cfg = NotifierConfig(nats_url=(f"nats://127.0.0.1:{closed}",), http_port=0)
    stop = asyncio.Event()
    task = asyncio.create_task(run(cfg, stop, registry=CollectorRegistry()))

    def listening() -> int:
        ports = [r.__dict__["port"] for r in caplog.records if r.getMessage() == "http.listening"]
        assert ports
        return int(ports[0])

    port = await assert_eventually(listening)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/healthz") as resp,
    ):
        assert resp.status == 503  # not ready: no NATS
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_stop_overdue_is_critical_and_says_how_to_answer_it(
    store: RecordStore, receiver: Receiver, start_notifier: StartNotifier
) -> None:
    """Issue 15, item 5: ``stop-overdue:<object id>`` is routed like every escalation (here by
    severity: it is ``critical``), and the message says how to answer it."""
    await start_notifier(
        slack_url=receiver.url("/critical"),
        slack_blocks=True,
        webhook_url=receiver.url("/rest"),
        routes=["@critical=slack", "*=webhook"],
    )
    job = new_job_id()
    await create_job(store, job)
    await escalate(store, job, "stop-overdue:17", "object c/17 was asked to stop (fence) ...")

    await assert_eventually(lambda: _all_delivered(store, job))
    [req] = receiver.accepted("/critical")
    assert req.esc_id == "stop-overdue:17"
    text = json.dumps(req.json)
    assert "(critical)" in text
    assert "emergency-stop" in text
    assert receiver.on("/rest") == []
