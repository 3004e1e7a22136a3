"""``dispatch nats init``: a site's identities (seeds 0600, kept on a second run), a server
configuration nats-server accepts holding no secret, and each service's variables."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from dispatch_cli.main import main
from dispatch_nats.identities import read_public_key
from tests.servers.nats import nats_server_binary


def test_init_writes_identities_a_valid_config_and_env_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "site"
    args = ["nats", "init", "--out", str(out), "--cluster", "slurm", "--namespace", "prod"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    seeds = {p.stem: p for p in (out / "identities").glob("*.nk")}
    assert set(seeds) == {"api", "supervisor", "notifier", "observer-slurm", "reader"}
    conf = (out / "nats-server.conf").read_text()
    for name, seed in seeds.items():
        assert stat.S_IMODE(seed.stat().st_mode) == 0o600, name
        assert seed.read_text().strip() not in conf + printed  # no secret shown or served
        assert read_public_key(seed) in conf
    assert '"prod.dispatch.record.*.api"' in conf
    assert '"_INBOX.prod.api.>"' in conf
    assert "no_auth_user" not in conf
    check = subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(out / "nats-server.conf")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    env = (out / "env/observer-slurm.env").read_text().splitlines()
    assert "OBSERVER_NATS_URL=nats://127.0.0.1:4222" in env
    assert f"OBSERVER_NATS_NKEY_SEED_FILE={seeds['observer-slurm'].resolve()}" in env
    assert "OBSERVER_NATS_INBOX_PREFIX=_INBOX.prod.observer-slurm" in env
    assert "OBSERVER_NAMESPACE=prod" in env
    assert not (out / "env/reader.env").exists()
    # a second run keeps every seed, and adds the new cluster's observer
    before = {n: p.read_bytes() for n, p in seeds.items()}
    assert main([*args, "--cluster", "k8s"]) == 0
    assert (out / "identities/observer-k8s.nk").exists()
    assert {n: p.read_bytes() for n, p in seeds.items()} == before


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--server", "a=h:1", "--server", "b=h:2"], "needs 3 servers"),
        (["--server", "nonsense"], "NAME=HOST:PORT"),
        (["--tls-cert", "x.pem"], "both the TLS certificate and its key"),
    ],
)
def test_init_refuses_what_cannot_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    args = ["nats", "init", "--out", str(tmp_path / "s"), "--cluster", "c", *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err
