"""The NATS settings every service shares: parsed from each service's own variables, checked
at start-up with errors naming the variable, turned into nats-py's options, and never
showing a secret (``services/common/nats_settings.py``)."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import trustme

from dispatch_nats.urls import redact_url
from services.api.config import ApiConfig
from services.common.config import ConfigError
from services.common.nats_settings import NatsSettings, nats_options
from services.notifier.config import load_config
from services.observer.config import ObserverConfig
from services.supervisor.config import SupervisorConfig

Load = Callable[[Mapping[str, str]], NatsSettings]


def _loaders(tmp_path: Path) -> list[tuple[str, Load]]:
    clusters = str(tmp_path / "clusters.toml")
    return [
        ("API_", ApiConfig.from_env),
        ("NOTIFIER_", load_config),
        (
            "SUPERVISOR_",
            lambda env: SupervisorConfig.from_env({**env, "SUPERVISOR_CLUSTERS_FILE": clusters}),
        ),
        (
            "OBSERVER_",
            lambda env: ObserverConfig.from_env(
                {**env, "OBSERVER_CLUSTER": "c", "OBSERVER_CLUSTERS_FILE": clusters}
            ),
        ),
    ]


@pytest.fixture
def seed(tmp_path: Path) -> Path:
    path = tmp_path / "svc.nk"
    path.write_text("SUAEXAMPLEONLYNOTAREALSEED\n")
    return path


def test_every_service_reads_the_same_variables_under_its_prefix(
    tmp_path: Path, seed: Path
) -> None:
    for prefix, load in _loaders(tmp_path):
        cfg = load(
            {
                f"{prefix}NATS_URL": "nats://a:4222,nats://b:4222,nats://c:4222",
                f"{prefix}NATS_NKEY_SEED_FILE": str(seed),
                f"{prefix}NATS_INBOX_PREFIX": "_INBOX.svc",
            }
        )
        assert cfg.nats_url == ("nats://a:4222", "nats://b:4222", "nats://c:4222"), prefix
        opts = nats_options(cfg)
        assert opts == {
            "servers": ["nats://a:4222", "nats://b:4222", "nats://c:4222"],
            "nkeys_seed": str(seed),
            "inbox_prefix": "_INBOX.svc",
        }, prefix


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NATS_NKEY_SEED_FILE": "/nowhere/x.nk"}, "NATS_NKEY_SEED_FILE: can't read /nowhere/x.nk"),
        ({"NATS_USER": "u"}, "NATS_USER needs {p}NATS_PASSWORD_FILE"),
        ({"NATS_PASSWORD": "p"}, "a NATS password needs {p}NATS_USER"),
        (
            {"NATS_TLS_CERT_FILE": "SEED"},
            "give both {p}NATS_TLS_CERT_FILE and {p}NATS_TLS_KEY_FILE",
        ),
        ({"NATS_NKEY_SEED_FILE": "SEED", "NATS_USER": "u", "NATS_PASSWORD": "p"}, "not several"),
        ({"NATS_URL": "http://x:1"}, "NATS_URL: 'http://x:1' is not a nats://"),
        ({"NATS_INBOX_PREFIX": "_INBOX.>"}, "NATS_INBOX_PREFIX: '_INBOX.>' is not a subject"),
        ({"NATS_TLS_CA_FILE": "SEED"}, "NATS_TLS_*"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_variable(
    tmp_path: Path, seed: Path, env: dict[str, str], message: str
) -> None:
    for prefix, load in _loaders(tmp_path):
        full = {prefix + k: (str(seed) if v == "SEED" else v) for k, v in env.items()}
        with pytest.raises(ConfigError) as caught:
            load(full)
        assert message.format(p=prefix) in str(caught.value), (prefix, str(caught.value))
        if not message.startswith("a NATS"):
            assert prefix in str(caught.value)


def test_the_password_comes_from_a_file_or_the_environment_and_is_never_shown(
    tmp_path: Path,
) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret-from-file\nignored\n")
    cfg = ApiConfig.from_env(
        {
            "API_NATS_URL": "nats://user:urlsecret@h:4222",
            "API_NATS_USER": "dispatch-api",
            "API_NATS_PASSWORD_FILE": str(pw),
        }
    )
    assert nats_options(cfg)["password"] == "s3cret-from-file"
    env_cfg = ApiConfig.from_env({"API_NATS_USER": "u", "API_NATS_PASSWORD": "s3cret-from-env"})
    assert nats_options(env_cfg)["password"] == "s3cret-from-env"
    for shown in (repr(cfg), repr(env_cfg), str(env_cfg)):
        assert "s3cret" not in shown
        assert "urlsecret" not in shown
    assert "nats_password='***'" in repr(env_cfg)


def test_urls_are_shown_without_their_credentials() -> None:
    assert redact_url("nats://user:pass@h:4222") == "nats://***@h:4222"
    assert redact_url("tls://token@h:4222") == "tls://***@h:4222"
    assert redact_url("nats://h:4222") == "nats://h:4222"


def test_tls_settings_make_a_context_that_trusts_the_ca(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "k.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    leaf = ca.issue_cert("client")
    leaf.cert_chain_pems[0].write_to_path(str(cert_file))
    leaf.private_key_pem.write_to_path(str(key_file))
    cfg = ApiConfig.from_env(
        {
            "API_NATS_TLS_CA_FILE": str(ca_file),
            "API_NATS_TLS_CERT_FILE": str(cert_file),
            "API_NATS_TLS_KEY_FILE": str(key_file),
        }
    )
    ctx: Any = nats_options(cfg)["tls"]
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.get_ca_certs()  # the test CA, loaded
