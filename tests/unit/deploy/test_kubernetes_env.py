"""deploy/kubernetes: every environment variable a Deployment sets is one its service reads, and
every variable its service requires is set.

Each dispatch container's environment is resolved as the kubelet would (``value``, and
``configMapKeyRef`` from the ConfigMaps of the manifests) and given to the service's own
configuration builder, the one its ``__main__`` calls: an unknown variable (a typo, a setting
that was renamed) and a missing required one are both its ``ConfigError``; a value of the wrong
type too. The files the manifests mount (``/etc/dispatch/...``) are made, empty or with a
placeholder, under a temporary directory, since the builder checks that they exist.
"""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.api.config import ApiConfig
from services.common.config import ConfigError
from services.notifier.config import load_config
from services.observer.config import ObserverConfig
from services.supervisor.config import SupervisorConfig
from tests.servers.pytest_kube_real import manifest_docs

MOUNT_ROOT = "/etc/dispatch/"

# The service each container runs (its ``args``: python -m <module>), with its builder and
# variable prefix.
BUILDERS: Mapping[str, tuple[str, Callable[[Mapping[str, str]], msgspec.Struct]]] = {
    "services.observer": ("OBSERVER_", ObserverConfig.from_env),
    "services.supervisor": ("SUPERVISOR_", SupervisorConfig.from_env),
    "services.notifier": ("NOTIFIER_", load_config),
    "services.api": ("API_", ApiConfig.from_env),
}


def _containers() -> list[tuple[str, dict[str, Any]]]:
    """(workload name, container) of every dispatch service container in the manifests."""
    found = []
    for doc in manifest_docs():
        if doc["kind"] not in ("Deployment", "StatefulSet", "DaemonSet"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            command = [*container.get("command", ()), *container.get("args", ())]
            if any(word in BUILDERS for word in command):
                found.append((doc["metadata"]["name"], container))
    return found


def _config_maps() -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d["data"] for d in manifest_docs() if d["kind"] == "ConfigMap"}


def _environment(container: Mapping[str, Any], root: Path) -> dict[str, str]:
    """The container's environment as the kubelet resolves it, mounted paths under ``root``."""
    maps = _config_maps()
    env: dict[str, str] = {}
    assert not container.get("envFrom"), "envFrom hides the names from this check"
    for var in container.get("env", ()):
        if "value" in var:
            value = var["value"]
        else:
            ref = var["valueFrom"]["configMapKeyRef"]
            value = maps[ref["name"]][ref["key"]]
        if value.startswith(MOUNT_ROOT):
            path = root / value.removeprefix(MOUNT_ROOT)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(_file_content(path.name, maps))
            os.chmod(path, 0o600)
            value = str(path)
        env[var["name"]] = value
    return env


def _file_content(name: str, maps: Mapping[str, Mapping[str, str]]) -> str:
    """What a mounted file holds: the ConfigMap key of that name (the clusters file), a
    certificate for a ``.pem`` (the builder loads the CA), else a placeholder (secrets)."""
    for data in maps.values():
        if name in data:
            return data[name]
    if name.endswith(".pem"):
        return _certificate_pem()
    return "placeholder\n"


@functools.cache
def _certificate_pem() -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "site CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _module(container: Mapping[str, Any]) -> str:
    command: list[str] = [*container.get("command", ()), *container.get("args", ())]
    return next(word for word in command if word in BUILDERS)


def test_every_service_runs_in_the_manifests() -> None:
    assert sorted(_module(c) for _, c in _containers()) == sorted(BUILDERS)


@pytest.mark.parametrize(("workload", "container"), _containers(), ids=lambda v: str(v)[:40])
def test_each_variable_set_is_read_and_each_required_one_is_set(
    workload: str, container: dict[str, Any], tmp_path: Path
) -> None:
    prefix, build = BUILDERS[_module(container)]
    env = _environment(container, tmp_path)
    strangers = [k for k in env if not k.startswith(prefix)]
    assert strangers == [], f"{workload}: variables no {prefix}* config reads: {strangers}"
    build(env)  # ConfigError: an unknown variable, a missing required one, a bad value


def test_a_typo_in_a_variable_is_refused(tmp_path: Path) -> None:
    """The check above has teeth: a misspelt variable is the builder's ConfigError."""
    _, container = _containers()[0]
    prefix, build = BUILDERS[_module(container)]
    env = _environment(container, tmp_path)
    env[prefix + "HTTP_PROT"] = "8080"
    with pytest.raises(ConfigError, match=prefix + "HTTP_PROT"):
        build(env)
