"""The notifier's configuration, routing and backoff: pure, no server (fast)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from dispatch_core.backoff import Backoff
from services.common.config import ConfigError
from services.notifier.channels import EmailChannel, Notice
from services.notifier.config import (
    EmailSpec,
    NotifierConfig,
    RoutesFile,
    WebhookSpec,
    build_setup,
    load_config,
    load_routes_file,
)
from services.notifier.routing import Route, Router, Severity, parse_route


def test_env_config_converts_values_and_splits_lists() -> None:
    cfg = load_config(
        {
            "NOTIFIER_HTTP_PORT": "9100",
            "NOTIFIER_SMTP_TO": "a@x.test,b@x.test",
            "NOTIFIER_ROUTES": "failed:*|cleanup-deadline=email+slack,@warning=slack",
            "NOTIFIER_SLACK_BLOCKS": "true",
            "OTHER": "ignored",
        }
    )
    assert cfg.http_port == 9100
    assert cfg.smtp_to == ["a@x.test", "b@x.test"]
    assert cfg.routes == ["failed:*|cleanup-deadline=email+slack", "@warning=slack"]
    assert cfg.slack_blocks is True


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"NOTIFIER_WEBHOOK": "http://x"}, "NOTIFIER_WEBHOOK"),
        ({"NOTIFIER_RETRY_BASE_S": "0"}, "NOTIFIER_RETRY_BASE_S"),
        ({"NOTIFIER_RETRY_JITTER": "1.5"}, "NOTIFIER_RETRY_JITTER"),
        ({"NOTIFIER_SMTP_SECURITY": "tls"}, "NOTIFIER_SMTP_SECURITY"),
        ({"NOTIFIER_DURABLE": "a.b"}, "NOTIFIER_DURABLE"),
    ],
)
def test_env_config_errors_name_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(env)


def test_parse_route() -> None:
    assert parse_route("failed:*|cleanup-deadline = email + slack") == Route(
        ids=("failed:*", "cleanup-deadline"), channels=("email", "slack")
    )
    assert parse_route("@critical=email") == Route(
        severities=(Severity.CRITICAL,), channels=("email",)
    )
    assert parse_route("*=webhook") == Route(channels=("webhook",))
    for bad in ("failed:*", "=slack", "failed:*=", "a||b=slack", "@urgent=slack"):
        with pytest.raises(ValueError, match="route"):
            parse_route(bad)


def test_severity_and_first_matching_route() -> None:
    router = Router(
        routes=(
            parse_route("failed:*|cleanup-deadline=email+slack"),
            parse_route("overdue:*=slack"),
            parse_route("@warning=pager"),
        ),
        default=("webhook",),
        severity=(("overdue:9", Severity.CRITICAL),),
    )
    assert router.severity_of("failed:preempted") == "critical"
    assert router.severity_of("refused:2") == "critical"
    assert router.severity_of("all-unknown:2") == "warning"
    assert router.severity_of("give-up") == "info"
    assert router.severity_of("something-new") == "warning"
    assert router.severity_of("overdue:9") == "critical"
    assert router.channels_for("failed:oom") == ("email", "slack")
    assert router.channels_for("cleanup-deadline") == ("email", "slack")
    assert router.channels_for("overdue:3") == ("slack",)
    assert router.channels_for("foreign:dj-x") == ("pager",)
    assert router.channels_for("give-up") == ("webhook",)


def test_default_route_is_every_configured_channel_else_terminal() -> None:
    assert build_setup(NotifierConfig()).router.default == ("terminal",)
    setup = build_setup(NotifierConfig(webhook_url="http://h", slack_url="http://s"))
    assert setup.router.default == ("webhook", "slack")
    assert set(setup.channels) == {"webhook", "slack", "terminal"}


def test_routes_must_name_known_channels() -> None:
    with pytest.raises(ConfigError, match=r"no channel named 'pager'.*terminal, webhook"):
        build_setup(NotifierConfig(webhook_url="http://h", routes=["failed:*=pager"]))
    setup = build_setup(NotifierConfig(routes=["failed:*=pager"]), plugins=["pager"])
    assert setup.router.channels_for("failed:x") == ("pager",)
    with pytest.raises(ConfigError, match="SMTP_TO"):
        build_setup(NotifierConfig(smtp_host="mail.test"))


def test_routes_file_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "routes.toml"
    toml.write_text(
        """
default = ["ops"]
[channels.ops]
type = "webhook"
url = "http://ops.test/hook"
secret = "k"
[channels.mail]
type = "email"
host = "smtp.test"
from = "d@x.test"
to = ["ml@x.test"]
security = "starttls"
[severity]
"overdue:*" = "critical"
[[routes]]
severities = ["critical"]
ids = ["overdue:*"]
channels = ["mail", "ops"]
"""
    )
    parsed = load_routes_file(toml)
    as_json = tmp_path / "routes.json"
    as_json.write_text(
        json.dumps(
            {
                "default": ["ops"],
                "channels": {
                    "ops": {"type": "webhook", "url": "http://ops.test/hook", "secret": "k"},
                    "mail": {
                        "type": "email",
                        "host": "smtp.test",
                        "from": "d@x.test",
                        "to": ["ml@x.test"],
                        "security": "starttls",
                    },
                },
                "severity": {"overdue:*": "critical"},
                "routes": [
                    {"severities": ["critical"], "ids": ["overdue:*"], "channels": ["mail", "ops"]}
                ],
            }
        )
    )
    assert load_routes_file(as_json) == parsed
    assert parsed.channels["ops"] == WebhookSpec(url="http://ops.test/hook", secret="k")
    mail = parsed.channels["mail"]
    assert isinstance(mail, EmailSpec)
    assert (mail.sender, mail.security) == ("d@x.test", "starttls")
    setup = build_setup(NotifierConfig(), parsed)
    assert setup.router.channels_for("overdue:1") == ("mail", "ops")
    assert setup.router.channels_for("failed:x") == ("ops",)  # critical, but not overdue:*
    assert setup.router.channels_for("give-up") == ("ops",)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('[channels.x]\ntype = "pager"\n', "pager"),
        ('[channels.x]\ntype = "webhook"\n', "url"),
        ("[[routes]]\nchanels = []\n", "chanels"),
        ('[severity]\n"a" = "urgent"\n', "urgent"),
        ("not toml = = =", "routes.toml"),
    ],
)
def test_routes_file_errors_name_the_problem(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "routes.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_routes_file(path)


def test_routes_file_channel_names_and_duplicates() -> None:
    with pytest.raises(ConfigError, match="already configured"):
        build_setup(
            NotifierConfig(webhook_url="http://h"),
            RoutesFile(channels={"webhook": WebhookSpec(url="http://other")}),
        )
    with pytest.raises(ConfigError, match="lower-case"):
        build_setup(NotifierConfig(), RoutesFile(channels={"Ops": WebhookSpec(url="http://o")}))
    with pytest.raises(ConfigError, match=r"missing\.txt"):
        load_routes_file(Path("/nonexistent/missing.txt"))


def test_backoff_doubles_caps_and_jitters_down() -> None:
    backoff = Backoff(base_s=1.0, max_s=10.0, jitter=0.5)
    assert [backoff.delay(n, 0.0) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.delay(3, 1.0) == 2.0  # at most half of 4 taken off
    assert backoff.delay(3, 0.5) == 3.0
    assert backoff.delay(10_000, 0.0) == 10.0  # no overflow
    assert backoff.delay(0, 0.0) == 1.0


def test_email_message_id_is_the_same_for_every_copy() -> None:
    channel = EmailChannel("email", EmailSpec(host="h", to=["a@x.test"], sender="d@ex.test"))
    notice = Notice(
        job_id="job-1",
        id="unmatched:2/1",
        detail="launch 2/1 unknown",
        at=datetime(2026, 1, 1, tzinfo=UTC),
        severity=Severity.WARNING,
    )
    first, again = channel.message(notice), channel.message(notice)
    assert first["Message-ID"] == again["Message-ID"]
    assert first["Message-ID"].endswith("@ex.test>")
    other = channel.message(msgspec.structs.replace(notice, id="unmatched:2/2"))
    assert other["Message-ID"] != first["Message-ID"]
    assert first["Subject"] == "[dispatch] warning: job job-1: unmatched:2/1"
    assert "abandon the attempt" in first.get_content()
