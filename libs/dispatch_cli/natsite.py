"""A site's NATS identities and server configuration: what ``dispatch nats init`` writes
(and ``dispatch up`` uses for its private server).

``write_site`` makes (or reuses) one nkey seed per identity under ``<out>/identities/`` (mode
0600) and renders the nats-server configuration of each server with
:func:`dispatch_nats.permissions.render_server_config`: one ``nats-server.conf`` for a single
server, or ``<server>.conf`` per server of a cluster. It also writes, per service, the
environment variables that point it at its identity (``<out>/env/<identity>.env``: file paths
and URLs only, no secret).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dispatch_nats import Layout
from dispatch_nats.identities import make_identities, seed_path
from dispatch_nats.permissions import (
    ClusterBlock,
    Identity,
    Role,
    TlsBlock,
    inbox_prefix,
    render_server_config,
    service_identities,
    users,
)

__all__ = [
    "PREFIXES",
    "ServerSpec",
    "Site",
    "identity_files",
    "service_env",
    "write_private_text",
    "write_site",
]

PREFIXES: Final = {
    Role.API: "API_",
    Role.SUPERVISOR: "SUPERVISOR_",
    Role.NOTIFIER: "NOTIFIER_",
    Role.OBSERVER: "OBSERVER_",
}
"""The environment prefix of each service (the reader is not a service)."""


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One nats-server of the site."""

    name: str
    host: str
    """Where clients reach it (and, in a cluster, where the other servers' routes do)."""
    port: int = 4222
    route_port: int = 6222


@dataclass(frozen=True, slots=True)
class Site:
    """What ``write_site`` wrote."""

    identities_dir: Path
    configs: dict[str, Path]
    """Server name -> its configuration file."""
    env_files: dict[str, Path]
    """Identity name -> its environment file."""
    urls: tuple[str, ...]


def write_private_text(path: Path, text: str, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` atomically with ``mode``."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def service_env(
    identity: Identity,
    *,
    urls: Sequence[str],
    identities_dir: Path,
    layout: Layout,
    tls_ca: str = "",
    tls_cert: str = "",
    tls_key: str = "",
) -> dict[str, str]:
    """The ``<PREFIX>NATS_*`` variables of the service of ``identity`` (no secret: paths).

    Raises:
        KeyError: ``identity`` is the reader, which is no service.
    """
    p = PREFIXES[identity.role]
    env = {
        f"{p}NATS_URL": ",".join(urls),
        f"{p}NATS_NKEY_SEED_FILE": str(seed_path(identities_dir, identity)),
        f"{p}NATS_INBOX_PREFIX": inbox_prefix(identity, layout),
    }
    if layout.namespace:
        env[f"{p}NAMESPACE"] = layout.namespace
    if tls_ca:
        env[f"{p}NATS_TLS_CA_FILE"] = tls_ca
    if tls_cert:
        env[f"{p}NATS_TLS_CERT_FILE"] = tls_cert
        env[f"{p}NATS_TLS_KEY_FILE"] = tls_key
    return env


def write_site(
    out: Path,
    *,
    clusters: Sequence[str],
    servers: Sequence[ServerSpec],
    layout: Layout,
    store_dir: str,
    listen_host: str = "0.0.0.0",
    cluster_name: str = "dispatch",
    tls_cert: str = "",
    tls_key: str = "",
    tls_ca: str = "",
    tls_verify: bool = False,
    client_cert: str = "",
    client_key: str = "",
    supervisor_durable: str = "supervisor",
    notifier_durable: str = "notifier",
    reader: bool = True,
) -> Site:
    """Make the identities and write every server's configuration and the services' env files.

    ``tls_cert``/``tls_key`` (and ``store_dir``) may hold ``{server}``, replaced by each
    server's name, for per-server certificates.

    Raises:
        ValueError: no server, two servers of one name, 2 servers (a JetStream cluster needs
            3 or more), or a certificate without its key.
        IdentityError: a seed can't be read or written.
    """
    if not servers:
        raise ValueError("give at least one server")
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise ValueError(f"server names must differ: {names}")
    if len(servers) == 2:
        raise ValueError("a JetStream cluster needs 3 servers (or 1): 2 can't elect a leader")
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("give both the TLS certificate and its key")
    out.mkdir(parents=True, exist_ok=True)
    identities_dir = out / "identities"
    keys = make_identities(identities_dir, service_identities(clusters, reader=reader))
    all_users = users(
        layout, keys, supervisor_durable=supervisor_durable, notifier_durable=notifier_durable
    )
    urls = tuple(f"nats://{s.host}:{s.port}" for s in servers)
    configs: dict[str, Path] = {}
    for s in servers:
        tls = None
        if tls_cert:
            tls = TlsBlock(
                cert_file=tls_cert.format(server=s.name),
                key_file=tls_key.format(server=s.name),
                ca_file=tls_ca,
                verify=tls_verify,
            )
        cluster = None
        if len(servers) > 1:
            cluster = ClusterBlock(
                name=cluster_name,
                listen=f"{listen_host}:{s.route_port}",
                routes=tuple(f"nats-route://{o.host}:{o.route_port}" for o in servers),
                tls=None
                if tls is None
                else TlsBlock(
                    cert_file=tls.cert_file, key_file=tls.key_file, ca_file=tls_ca, verify=True
                ),
            )
        text = render_server_config(
            all_users,
            host=listen_host,
            port=s.port,
            store_dir=store_dir.format(server=s.name),
            server_name=s.name,
            tls=tls,
            cluster=cluster,
        )
        path = out / ("nats-server.conf" if len(servers) == 1 else f"{s.name}.conf")
        write_private_text(path, text, 0o644)
        configs[s.name] = path
    env_dir = out / "env"
    env_dir.mkdir(exist_ok=True)
    env_files: dict[str, Path] = {}
    for ident in keys:
        if ident.role is Role.READER:
            continue
        env = service_env(
            ident,
            urls=urls,
            identities_dir=identities_dir.resolve(),
            layout=layout,
            tls_ca=tls_ca,
            tls_cert=client_cert,
            tls_key=client_key,
        )
        path = env_dir / f"{ident.name}.env"
        write_private_text(path, "".join(f"{k}={v}\n" for k, v in env.items()), 0o644)
        env_files[ident.name] = path
    return Site(identities_dir=identities_dir, configs=configs, env_files=env_files, urls=urls)


def identity_files(directory: Path, identities: Sequence[Identity]) -> Mapping[Identity, Path]:
    """The credential file of each identity in ``directory`` (``<id>.creds`` if present,
    else ``<id>.nk``); missing ones are left out."""
    found: dict[Identity, Path] = {}
    for ident in identities:
        for suffix in (".creds", ".nk"):
            path = directory / f"{ident.name}{suffix}"
            if path.is_file():
                found[ident] = path
                break
    return found
