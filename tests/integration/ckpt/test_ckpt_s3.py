"""The checkpoint helper on S3 (seed 004), against SeaweedFS and moto's server over HTTP on
loopback: conditional-create publication, exclusivity across processes, latest over every
page, the overlap harness, the CLI and watch (including a scan over --timeout)."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from dispatch_ckpt import (
    AlreadyPublished,
    Checkpoints,
    InvalidPath,
    InvalidRoot,
    MalformedName,
    Publication,
    SaveNotFound,
    StoreError,
    Watcher,
    open_store,
)
from dispatch_ckpt.names import encode_name
from dispatch_ckpt.overlap import Design, run_trials
from dispatch_ckpt.s3 import S3Store
from dispatch_core.epoch import epoch
from tests.integration.ckpt.conftest import BUCKET
from tests.servers.s3 import S3Server
from tests.unit.ckpt.support import race_publish, run_cli

pytestmark = pytest.mark.integration

OLD = epoch(0, 1, 0)
NEW = epoch(0, 2, 0)


def identity(attempt: str, ep: int) -> dict[str, str]:
    return {"DISPATCH_ATTEMPT": attempt, "DISPATCH_EPOCH": str(ep)}


def put(s3: S3Server, root: str, relpath: str, body: bytes = b"x") -> None:
    store = open_store(root)
    assert isinstance(store, S3Store)
    s3.client().put_object(Bucket=store.bucket, Key=store.key(relpath), Body=body)


def test_publish_is_an_empty_conditional_create(s3: S3Server, s3_root: str) -> None:
    ckpt = Checkpoints.open(s3_root, identity("a1", OLD))
    assert ckpt.exec_dir() == f"{s3_root}/exec/a1"
    put(s3, s3_root, "exec/a1/checkpoint-500/model.bin")
    pub = ckpt.publish(500, f"{s3_root}/exec/a1/checkpoint-500/")
    assert pub == Publication(epoch=OLD, step=500, path="exec/a1/checkpoint-500")
    store = ckpt.store
    assert isinstance(store, S3Store)
    body = s3.client().get_object(Bucket=BUCKET, Key=store.key(f"pub/{pub.name}"))["Body"]
    assert body.read() == b""
    assert ckpt.latest() == pub
    assert ckpt.location(pub) == f"{s3_root}/exec/a1/checkpoint-500"
    with pytest.raises(AlreadyPublished) as info:
        ckpt.publish(500, f"{s3_root}/exec/a1/checkpoint-500")
    assert info.value.name == pub.name


def test_publishing_needs_a_save_inside_the_root(s3_root: str) -> None:
    ckpt = Checkpoints.open(s3_root, identity("a1", OLD))
    with pytest.raises(SaveNotFound):
        ckpt.publish(1, f"{s3_root}/exec/a1/typo")
    with pytest.raises(InvalidPath):
        ckpt.publish(1, f"s3://{BUCKET}/elsewhere/x")
    with pytest.raises(InvalidPath):
        ckpt.publish(1, "/local/path")
    assert ckpt.latest() is None


def test_malformed_prefix_is_refused() -> None:
    with pytest.raises(InvalidRoot):
        open_store(f"s3://{BUCKET}/a/../b")


def test_many_processes_publishing_the_same_name_exactly_one_succeeds(
    s3: S3Server, s3_root: str, s3_env: dict[str, str]
) -> None:
    environ = {**s3_env, **identity("a1", OLD)}
    for step in range(2):
        put(s3, s3_root, f"exec/a1/s-{step}/model.bin")
        outcomes = race_publish(s3_root, environ, step, f"{s3_root}/exec/a1/s-{step}", 10)
        assert sorted(outcomes) == ["already-published"] * 9 + ["published"], outcomes
    assert len(Checkpoints.open(s3_root).publications()) == 2


def bulk_publish(root: str, names: list[str]) -> None:
    store = open_store(root)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(store.create_entry, names))


def test_latest_reads_every_page_past_1000_entries(s3: S3Server, s3_root: str) -> None:
    names = [encode_name(OLD, step, f"exec/a1/s-{step}") for step in range(1050)]
    # The greatest one is created first, so it is on the first page; another lineage's
    # greater epoch sorts last, so only the second page shows it.
    names.append(encode_name(NEW, 3, "exec/a2/s-3"))
    bulk_publish(s3_root, names)
    ckpt = Checkpoints.open(s3_root)
    listing = ckpt.listing()
    assert len(listing.names) == 1051
    assert listing.pages == 2
    assert ckpt.latest() == Publication(epoch=NEW, step=3, path="exec/a2/s-3")
    # A malformed name on the last page is still found and named.
    bad = "99999999999999999999-bad"
    bulk_publish(s3_root, [bad])
    with pytest.raises(MalformedName) as info:
        ckpt.latest()
    assert info.value.entry == bad


def test_overlap_harness_200_trials(s3: S3Server, s3_env: dict[str, str]) -> None:
    base = open_store(f"s3://{BUCKET}/overlap-{uuid.uuid4().hex[:8]}")
    assert isinstance(base, S3Store)
    client = base._client  # one connection pool for all the trials' roots

    def root(i: int) -> S3Store:
        return S3Store(client, BUCKET, f"{base.key('')}t{i}")

    result = run_trials(root, 200, seed=5)
    assert result.lost == 0
    assert result.late >= 80
    # The harness does catch the design the seed rejects, on S3 too.
    # How often it loses depends on timing (3 to 9 of 10 were seen here), so ask only that it
    # loses at all over enough trials; the seed's own figure was 4 of 40.
    strawman = run_trials(root, 30, design=Design.CHECK_THEN_RENAME)
    assert strawman.lost >= 1


def test_cli_publish_and_latest_on_s3(s3: S3Server, s3_root: str, s3_env: dict[str, str]) -> None:
    env = {**s3_env, **identity("a9", NEW)}
    exec_dir = run_cli("env", "--root", s3_root, env=env)
    assert exec_dir.stdout == f"{s3_root}/exec/a9\n"
    put(s3, s3_root, "exec/a9/checkpoint-7/model.bin")
    pub = run_cli(
        "publish", "--root", s3_root, "--step", "7", f"{s3_root}/exec/a9/checkpoint-7", env=env
    )
    assert pub.returncode == 0, pub.stderr
    result = run_cli("latest", "--root", s3_root, "--json", env=s3_env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "epoch": NEW,
        "step": 7,
        "path": f"{s3_root}/exec/a9/checkpoint-7",
    }
    nothing = run_cli("latest", "--root", f"{s3_root}-empty", env=s3_env)
    assert nothing.returncode == 3


STATE = json.dumps({"global_step": 10})


def test_watch_publishes_hf_save_on_s3_once_complete(s3: S3Server, s3_root: str) -> None:
    ckpt = Checkpoints.open(s3_root, identity("a1", OLD), timeout_s=10)
    watcher = Watcher(ckpt, timeout_s=30)
    put(s3, s3_root, "exec/a1/checkpoint-10/model.safetensors")
    put(s3, s3_root, "exec/a1/checkpoint-10/optimizer.pt")
    assert watcher.scan() == []
    put(s3, s3_root, "exec/a1/checkpoint-10/trainer_state.json", STATE.encode())
    put(s3, s3_root, "exec/a1/dcp/step-20/.metadata")
    made = watcher.scan()
    assert [(p.step, p.path) for p in made] == [
        (10, "exec/a1/checkpoint-10"),
        (20, "exec/a1/dcp/step-20"),
    ]
    assert watcher.scan() == []


def test_cli_watch_on_s3(s3: S3Server, s3_root: str, s3_env: dict[str, str]) -> None:
    put(s3, s3_root, "exec/a1/checkpoint-10/model.safetensors")
    put(s3, s3_root, "exec/a1/checkpoint-10/trainer_state.json", STATE.encode())
    env = {**s3_env, **identity("a1", OLD)}
    result = run_cli("watch", "--root", s3_root, "--once", "--timeout", "30", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["path"] == f"{s3_root}/exec/a1/checkpoint-10"


def test_cli_watch_exits_non_zero_on_a_store_error(s3_env: dict[str, str]) -> None:
    env = {**s3_env, **identity("a1", OLD)}
    root = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/job"
    result = run_cli("watch", "--root", root, "--timeout", "30", env=env)
    assert result.returncode == 1
    assert "dispatch-ckpt: error:" in result.stderr
    assert "NoSuchBucket" in result.stderr
    with pytest.raises(StoreError):
        Checkpoints.open(root).latest()


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An HTTP endpoint on loopback that accepts connections and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_cli_watch_exits_non_zero_when_a_scan_exceeds_the_timeout(
    s3_env: dict[str, str], silent_endpoint: str
) -> None:
    env = {**s3_env, **identity("a1", OLD), "AWS_ENDPOINT_URL": silent_endpoint}
    result = run_cli("watch", "--root", f"s3://{BUCKET}/job", "--timeout", "1", env=env)
    assert result.returncode == 1
    assert "not finished within 1 s" in result.stderr
