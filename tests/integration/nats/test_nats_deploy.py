"""deploy/nats: ``dispatch nats init`` writes a 3-server JetStream cluster's configuration
(identities, permissions, TLS for clients and mutual TLS between servers) that real
nats-server processes accept and run; services reach it with the variables it writes; a
credential is rotated with a reload, as deploy/nats/README.md says."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
import trustme
from nats.aio.client import Client as NATS

from dispatch_cli.embedded import free_port
from dispatch_cli.main import main
from dispatch_core import WriterKind
from dispatch_nats import NatsStoreError, RecordStore, ensure_streams
from dispatch_nats.identities import read_public_key
from services.api.config import ApiConfig
from services.common.nats_settings import nats_options
from tests.servers.locked_nats import connect_or_close
from tests.servers.nats import NatsServer, nats_server_binary
from tests.util import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NAMES = ("n1", "n2", "n3")


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


@dataclass
class Deployed:
    """The generated site, its three running servers, and the command that generated it."""

    out: Path
    servers: list[NatsServer]
    args: list[str]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Deployed]:
    tls = tmp_path / "tls"
    tls.mkdir()
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tls / "ca.pem"))
    for name in NAMES:
        leaf = ca.issue_cert("127.0.0.1", "localhost", f"{name}.local")
        leaf.cert_chain_pems[0].write_to_path(str(tls / f"{name}.pem"))
        leaf.private_key_pem.write_to_path(str(tls / f"{name}-key.pem"))
    ports = {name: (free_port(), free_port()) for name in NAMES}
    out = tmp_path / "site"
    args = [
        "nats", "init", "--out", str(out), "--cluster", "slurm", "--cluster", "k8s",
        "--listen", "127.0.0.1", "--store-dir", str(tmp_path / "store-{server}"),
        "--tls-cert", str(tls / "{server}.pem"), "--tls-key", str(tls / "{server}-key.pem"),
        "--tls-ca", str(tls / "ca.pem"),
    ]  # fmt: skip
    for name, (port, route) in ports.items():
        args += ["--server", f"{name}=127.0.0.1:{port}:{route}"]
    assert main(args) == 0
    servers = []
    try:
        for name in NAMES:
            conf = out / f"{name}.conf"
            check = subprocess.run(
                [str(nats_server_binary()), "-t", "-c", str(conf)],
                capture_output=True,
                text=True,
                check=False,
            )
            assert check.returncode == 0, check.stdout + check.stderr
            server = NatsServer(tmp_path / f"store-{name}", config_file=conf)
            server.port = ports[name][0]
            server.start()
            servers.append(server)
        yield Deployed(out, servers, args)
    finally:
        for server in servers:
            server.stop()


async def test_a_generated_three_server_cluster_runs_locked_with_tls(cluster: Deployed) -> None:
    out, servers = cluster.out, cluster.servers
    seeds = sorted(p.name for p in (out / "identities").glob("*.nk"))
    assert seeds == [
        "api.nk",
        "notifier.nk",
        "observer-k8s.nk",
        "observer-slurm.nk",
        "reader.nk",
        "supervisor.nk",
    ]
    for seed in (out / "identities").glob("*.nk"):
        assert stat.S_IMODE(seed.stat().st_mode) == 0o600
        assert seed.read_text().strip() not in (out / "n1.conf").read_text()
    conf = (out / "n1.conf").read_text()
    assert "cluster:" in conf
    assert "verify: true" in conf
    assert "no_auth_user" not in conf
    # the API, configured only by the variables the generator wrote
    env = _env_file(out / "env/api.env")
    assert env["API_NATS_URL"] == ",".join(s.url for s in servers)
    cfg = ApiConfig.from_env(env)
    nc = await connect_or_close(**nats_options(cfg), connect_timeout=5, max_reconnect_attempts=-1)
    try:

        async def streams_at_three_replicas() -> None:
            try:
                await ensure_streams(nc, replicas=3)
            except NatsStoreError as err:
                raise AssertionError(f"cluster not ready: {err}") from err

        await assert_eventually(streams_at_three_replicas, timeout_s=60, interval_s=0.5)
        store = RecordStore(nc, writer=WriterKind.API)
        seq = await store.append("deployed", b"{}", expected_last_seq=0, msg_id="deployed:1")
        assert [e.seq for e in await store.read("deployed")] == [seq]
        info = await nc.jetstream().stream_info("DISPATCH_RECORD")
        assert info.config.num_replicas == 3
        await store.aclose()
    finally:
        await nc.close()
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization"):
        await connect_or_close(
            servers=[servers[0].url],
            tls=nats_options(cfg)["tls"],
            allow_reconnect=False,
            max_reconnect_attempts=1,  # nats-py: 0 retries the first connect for ever
            reconnect_time_wait=0.1,
            connect_timeout=5,
        )


async def test_rotating_a_credential_with_a_reload(cluster: Deployed) -> None:
    out, servers = cluster.out, cluster.servers
    seed = out / "identities/notifier.nk"
    old_key = read_public_key(seed)
    old_seed = out / "old-notifier.nk"
    old_seed.write_bytes(seed.read_bytes())
    env = _env_file(out / "env/notifier.env")
    ca = env["NOTIFIER_NATS_TLS_CA_FILE"]
    tls = nats_options(ApiConfig.from_env({"API_NATS_TLS_CA_FILE": ca}))["tls"]
    urls = env["NOTIFIER_NATS_URL"].split(",")

    async def connect(seed_file: Path) -> NATS:
        return await connect_or_close(
            servers=urls,
            nkeys_seed=str(seed_file),
            inbox_prefix="_INBOX.notifier",
            tls=tls,
            allow_reconnect=False,
            max_reconnect_attempts=1,  # nats-py: 0 retries the first connect for ever
            reconnect_time_wait=0.1,
            connect_timeout=5,
        )

    before = await connect(seed)
    # 1. a new seed for the notifier alone; the configuration names its new key
    seed.unlink()
    assert main(cluster.args) == 0
    new_key = read_public_key(seed)
    assert new_key != old_key
    conf = (out / "n1.conf").read_text()
    assert old_key not in conf
    assert new_key in conf
    assert read_public_key(out / "identities/api.nk") in conf  # the others are kept
    # 2. reload every server
    for server in servers:
        os.kill(server.pid, signal.SIGHUP)

    def old_connection_closed() -> None:
        assert before.is_closed, "the old key's connection is still open"

    try:
        await assert_eventually(old_connection_closed, timeout_s=30)
    finally:
        await before.close()

    # 3. the old seed is refused everywhere, the new one accepted
    async def old_refused_new_accepted() -> None:
        try:
            old = await connect(old_seed)
        except nats.errors.Error:
            pass
        else:
            await old.close()
            raise AssertionError("the old seed still connects")
        new = await connect(seed)
        await new.close()

    await assert_eventually(old_refused_new_accepted, timeout_s=30, interval_s=0.5)
