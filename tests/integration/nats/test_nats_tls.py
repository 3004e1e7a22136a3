"""TLS between the services and a locked nats-server, with a CA made in the test (trustme).

The services' own settings (``<PREFIX>NATS_TLS_CA_FILE`` ..., through each service's
``from_env`` and ``connect_nats``) reach a server that requires TLS; a client that does not
trust the CA is refused; with client certificates required, a client without one is
refused and the services' client certificate is accepted.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import nats.errors
import pytest
import trustme

from dispatch_core import WriterKind
from dispatch_nats import DEFAULT_LAYOUT, RecordStore, ensure_streams
from dispatch_nats.permissions import TlsBlock
from services.api.config import ApiConfig
from services.common.lifecycle import connect_nats
from services.common.nats_settings import NatsSettings
from services.notifier.config import load_config as notifier_config
from services.observer.config import ObserverConfig
from services.supervisor.config import SupervisorConfig
from tests.servers.locked_nats import LockedNats

pytestmark = pytest.mark.integration


class Pki:
    """A CA, the server's certificate and a client certificate, as PEM files."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA()
        self.ca_file = root / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.server_cert, self.server_key = root / "server.pem", root / "server-key.pem"
        server.cert_chain_pems[0].write_to_path(str(self.server_cert))
        server.private_key_pem.write_to_path(str(self.server_key))
        client = self.ca.issue_cert("dispatch-services")
        self.client_cert, self.client_key = root / "client.pem", root / "client-key.pem"
        client.cert_chain_pems[0].write_to_path(str(self.client_cert))
        client.private_key_pem.write_to_path(str(self.client_key))

    def server_tls(self, *, verify: bool) -> TlsBlock:
        return TlsBlock(
            cert_file=str(self.server_cert),
            key_file=str(self.server_key),
            ca_file=str(self.ca_file),
            verify=verify,
        )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_site(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[LockedNats]:
    """A locked server requiring TLS (server certificate only)."""
    site = LockedNats(tmp_path_factory.mktemp("tls"), tls=pki.server_tls(verify=False))
    site.start()
    yield site
    site.stop()


@pytest.fixture(scope="module")
def mtls_site(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[LockedNats]:
    """A locked server requiring TLS and a client certificate signed by the CA."""
    site = LockedNats(tmp_path_factory.mktemp("mtls"), tls=pki.server_tls(verify=True))
    site.start()
    yield site
    site.stop()


def _configs(
    site: LockedNats, tmp_path: Path, extra: Callable[[str], Mapping[str, str]]
) -> list[tuple[str, NatsSettings]]:
    """Each service's config, built by its own ``from_env`` from the variables a site sets."""
    clusters = tmp_path / "clusters.toml"
    clusters.write_text(
        f'[[clusters]]\nname = "local"\nbackend = "local"\ndata_dir = "{tmp_path}"\n'
    )
    out: list[tuple[str, NatsSettings]] = []
    for identity, build, more in [
        ("api", ApiConfig.from_env, {}),
        ("supervisor", SupervisorConfig.from_env, {"CLUSTERS_FILE": str(clusters)}),
        ("notifier", notifier_config, {}),
        (
            "observer-local",
            ObserverConfig.from_env,
            {"CLUSTER": "local", "CLUSTERS_FILE": str(clusters)},
        ),
    ]:
        env = site.service_env(identity)
        prefix = next(iter(env)).split("NATS_")[0]
        env.update({prefix + k: v for k, v in more.items()})
        env.update({prefix + k: v for k, v in extra(prefix).items()})
        build_any: Any = build
        out.append((identity, build_any(env)))
    return out


async def test_every_service_connects_over_tls_with_its_settings(
    tls_site: LockedNats, pki: Pki, tmp_path: Path
) -> None:
    configs = _configs(tls_site, tmp_path, lambda p: {"NATS_TLS_CA_FILE": str(pki.ca_file)})
    stop = asyncio.Event()
    for identity, cfg in configs:
        nc = await connect_nats(cfg, stop, name=f"tls-{identity}")
        assert nc is not None
        try:
            # the server requires TLS: a connection exists only if the handshake succeeded
            await ensure_streams(nc, layout=DEFAULT_LAYOUT)
            if identity == "api":
                store = RecordStore(nc, writer=WriterKind.API)
                await store.append("tls-job", b"{}", expected_last_seq=0, msg_id="tls-job:1")
                await store.aclose()
        finally:
            await nc.close()


REFUSED = (TimeoutError, ssl.SSLError, nats.errors.Error, OSError)


async def _refused(site: LockedNats, tls: ssl.SSLContext | None) -> list[Exception]:
    """Connect as the api identity with ``tls``; return the errors the client reported
    (the connection must not succeed)."""
    errors: list[Exception] = []
    with pytest.raises(REFUSED):
        await site.connect("api", errors, tls=tls, total_timeout_s=10)
    return errors


async def test_a_client_without_the_ca_is_refused(tls_site: LockedNats) -> None:
    for tls in (ssl.create_default_context(), None):  # system CAs only; no TLS settings
        errors = await _refused(tls_site, tls)
        assert any("CERTIFICATE_VERIFY_FAILED" in str(e) for e in errors), errors


async def test_client_certificates_required(
    mtls_site: LockedNats, pki: Pki, tmp_path: Path
) -> None:
    errors = await _refused(mtls_site, ssl.create_default_context(cafile=str(pki.ca_file)))
    assert errors, "no error reported for a client without a certificate"
    configs = _configs(
        mtls_site,
        tmp_path,
        lambda p: {
            "NATS_TLS_CA_FILE": str(pki.ca_file),
            "NATS_TLS_CERT_FILE": str(pki.client_cert),
            "NATS_TLS_KEY_FILE": str(pki.client_key),
        },
    )
    stop = asyncio.Event()
    for identity, cfg in configs:
        nc = await connect_nats(cfg, stop, name=f"mtls-{identity}")
        assert nc is not None, identity
        try:
            await ensure_streams(nc, layout=DEFAULT_LAYOUT)
        finally:
            await nc.close()
