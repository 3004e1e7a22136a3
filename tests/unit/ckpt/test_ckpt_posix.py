"""A checkpoint root on the local file system (seed 004): the execution folder, exclusive
durable publication, latest by listing, supersession, and exclusivity across processes."""

from __future__ import annotations

import os
from pathlib import Path

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
    open_store,
)
from dispatch_ckpt.names import encode_name
from dispatch_ckpt.posix import PosixStore
from dispatch_core.epoch import epoch
from tests.unit.ckpt.support import race_publish

OLD = epoch(0, 1, 0)
NEW = epoch(0, 2, 0)


def open_exec(root: Path, attempt: str, ep: int) -> Checkpoints:
    return Checkpoints.open(str(root), {"DISPATCH_ATTEMPT": attempt, "DISPATCH_EPOCH": str(ep)})


def save(ckpt: Checkpoints, name: str, content: bytes = b"state") -> str:
    folder = Path(ckpt.exec_dir()) / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.bin").write_bytes(content)
    return str(folder)


def test_execution_folder_is_root_exec_attempt_and_created(tmp_path: Path) -> None:
    ckpt = open_exec(tmp_path, "job-7.1.0", OLD)
    folder = ckpt.exec_dir()
    assert folder == str(tmp_path.resolve() / "exec" / "job-7.1.0")
    assert Path(folder).is_dir()
    assert ckpt.exec_dir() == folder  # idempotent


def test_publish_creates_one_empty_entry_with_the_full_name(tmp_path: Path) -> None:
    ckpt = open_exec(tmp_path, "a1", OLD)
    path = save(ckpt, "checkpoint-500")
    pub = ckpt.publish(500, path)
    assert pub == Publication(epoch=OLD, step=500, path="exec/a1/checkpoint-500")
    entries = os.listdir(tmp_path / "pub")
    assert entries == [encode_name(OLD, 500, "exec/a1/checkpoint-500")]
    assert (tmp_path / "pub" / entries[0]).stat().st_size == 0
    assert ckpt.latest() == pub
    assert ckpt.location(pub) == path


def test_second_publish_of_the_same_name_is_an_error(tmp_path: Path) -> None:
    ckpt = open_exec(tmp_path, "a1", OLD)
    path = save(ckpt, "checkpoint-500")
    ckpt.publish(500, path)
    entry = tmp_path / "pub" / encode_name(OLD, 500, "exec/a1/checkpoint-500")
    before = entry.stat()
    with pytest.raises(AlreadyPublished) as info:
        ckpt.publish(500, path)
    assert info.value.name == entry.name
    assert str(entry.resolve()) in str(info.value)
    after = entry.stat()
    # Never rewritten or appended to.
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )


def test_publishing_a_symlinked_name_is_refused_not_followed(tmp_path: Path) -> None:
    ckpt = open_exec(tmp_path, "a1", OLD)
    path = save(ckpt, "s-1")
    (tmp_path / "pub").mkdir()
    target = tmp_path / "elsewhere"
    (tmp_path / "pub" / encode_name(OLD, 1, "exec/a1/s-1")).symlink_to(target)
    with pytest.raises(AlreadyPublished):
        ckpt.publish(1, path)
    assert not target.exists()


def test_path_must_be_a_save_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ckpt = open_exec(root, "a1", OLD)
    outside = tmp_path / "outside"
    outside.mkdir()
    with pytest.raises(InvalidPath, match="inside the root"):
        ckpt.publish(1, str(outside))
    with pytest.raises(InvalidPath, match="inside the root"):
        ckpt.publish(1, str(root))
    with pytest.raises(InvalidPath, match="inside the root"):
        ckpt.publish(1, str(root / ".." / "outside"))
    (root / "pub").mkdir(parents=True)
    with pytest.raises(InvalidPath, match="pub/"):
        ckpt.publish(1, str(root / "pub"))
    with pytest.raises(SaveNotFound) as info:
        ckpt.publish(1, str(root / "exec" / "a1" / "typo"))
    assert info.value.path == str(root.resolve() / "exec" / "a1" / "typo")
    assert os.listdir(root / "pub") == []


def test_a_symlinked_root_publishes_the_same_name_however_spelled(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    ckpt = open_exec(link, "a1", OLD)
    path = save(ckpt, "s-3")
    pub = ckpt.publish(3, str(link / "exec" / "a1" / "s-3"))
    assert pub.path == "exec/a1/s-3"
    with pytest.raises(AlreadyPublished):
        ckpt.publish(3, path)


def test_latest_is_none_when_nothing_is_published(tmp_path: Path) -> None:
    assert open_exec(tmp_path, "a1", OLD).latest() is None
    (tmp_path / "pub").mkdir()
    assert Checkpoints.open(str(tmp_path)).latest() is None


def test_latest_names_an_entry_that_does_not_parse(tmp_path: Path) -> None:
    ckpt = open_exec(tmp_path, "a1", OLD)
    ckpt.publish(1, save(ckpt, "s-1"))
    (tmp_path / "pub" / "notes.txt").touch()
    with pytest.raises(MalformedName) as info:
        ckpt.latest()
    assert info.value.entry == "notes.txt"


def test_a_folder_in_pub_is_an_entry_that_does_not_parse(tmp_path: Path) -> None:
    ckpt = open_exec(tmp_path, "a1", OLD)
    ckpt.publish(1, save(ckpt, "s-1"))
    (tmp_path / "pub" / "sub").mkdir()
    with pytest.raises(MalformedName, match="'sub'"):
        ckpt.latest()


def test_old_late_publication_with_higher_step_never_outranks_replacement(
    tmp_path: Path,
) -> None:
    old = open_exec(tmp_path, "old", OLD)
    old.publish(100, save(old, "checkpoint-100"))
    new = open_exec(tmp_path, "new", NEW)
    resume = new.latest()
    assert resume is not None
    assert resume.epoch == OLD  # the replacement resumes from the old run's save
    new.publish(150, save(new, "checkpoint-150"))
    old.publish(10_000, save(old, "checkpoint-10000"))  # late, and a far higher step
    latest = new.latest()
    assert latest is not None
    assert (latest.epoch, latest.step, latest.path) == (NEW, 150, "exec/new/checkpoint-150")


def test_superseding_job_outranks_the_old_job_and_can_still_read_its_saves(
    tmp_path: Path,
) -> None:
    old = open_exec(tmp_path, "g0-n3", epoch(0, 3, 7))
    for step in (1000, 2000, 3000):
        old.publish(step, save(old, f"checkpoint-{step}", f"old@{step}".encode()))
    sup = open_exec(tmp_path, "g1-n1", epoch(1, 1, 0))
    resume = sup.latest()
    assert resume is not None
    assert (resume.epoch, resume.step) == (epoch(0, 3, 7), 3000)
    assert (Path(sup.location(resume)) / "model.bin").read_bytes() == b"old@3000"
    sup.publish(1, save(sup, "checkpoint-1"))
    latest = sup.latest()
    assert latest is not None
    assert (latest.epoch, latest.step) == (epoch(1, 1, 0), 1)
    # Every older save stays published and readable.
    assert [p.step for p in sup.publications()] == [1000, 2000, 3000, 1]
    for pub in sup.publications()[:3]:
        assert (Path(sup.location(pub)) / "model.bin").read_bytes() == f"old@{pub.step}".encode()


def test_many_processes_publishing_the_same_name_exactly_one_succeeds(tmp_path: Path) -> None:
    environ = {"DISPATCH_ATTEMPT": "a1", "DISPATCH_EPOCH": str(OLD)}
    ckpt = Checkpoints.open(str(tmp_path), environ)
    for step in range(3):
        path = save(ckpt, f"s-{step}")
        outcomes = race_publish(str(tmp_path), environ, step, path, processes=16)
        assert sorted(outcomes) == ["already-published"] * 15 + ["published"], outcomes
    assert len(os.listdir(tmp_path / "pub")) == 3


def test_store_error_when_pub_cannot_be_created(tmp_path: Path) -> None:
    ckpt = open_exec(tmp_path, "a1", OLD)
    path = save(ckpt, "s-1")
    (tmp_path / "pub").write_text("not a folder")
    with pytest.raises(StoreError) as info:
        ckpt.publish(1, path)
    assert info.value.operation == "create entry"
    with pytest.raises(StoreError, match="list"):
        ckpt.latest()


@pytest.mark.parametrize("root", ["", "gs://bucket/x", "file:///tmp/x", "s3://", "s3:///x"])
def test_roots_that_are_neither_path_nor_s3_url_are_refused(root: str) -> None:
    with pytest.raises(InvalidRoot):
        open_store(root)


def test_walk_prunes_and_survives_folders_deleted_meanwhile(tmp_path: Path) -> None:
    store = PosixStore(tmp_path)
    for folder in ("exec/a/x/deep", "exec/a/y", "exec/a/z"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "exec/a/y/f").touch()
    seen = []
    for folder, subdirs, files in store.walk("exec/a"):
        seen.append((folder, sorted(subdirs), files))
        if folder == "exec/a":
            subdirs.remove("x")
            (tmp_path / "exec/a/z").rmdir()  # a rotation deleting a folder mid-walk
    assert seen[0] == ("exec/a", ["x", "y", "z"], [])
    assert ("exec/a/y", [], ["f"]) in seen
    assert all(not folder.startswith("exec/a/x") for folder, _, _ in seen)


def test_write_bytes_is_durable_and_whole(tmp_path: Path) -> None:
    store = PosixStore(tmp_path)
    store.write_bytes("exec/a/state.pt", b"123")
    store.write_bytes("exec/a/state.pt", b"4567")
    assert store.read_bytes("exec/a/state.pt") == b"4567"
    assert os.listdir(tmp_path / "exec" / "a") == ["state.pt"]  # no temporary left behind
    assert store.read_bytes("exec/a/missing") is None
    assert store.read_bytes("exec/a") is None  # a folder is not a file
