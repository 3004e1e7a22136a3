"""watch (seed 004): publish each new save once complete, by the frameworks' completion
markers, never a half-written one; stop at the first error with a non-zero exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dispatch_ckpt import (
    AlreadyPublished,
    Checkpoints,
    Publication,
    SaveKind,
    StoreError,
    UnknownStep,
    Watcher,
    find_saves,
)
from dispatch_ckpt.posix import PosixStore
from dispatch_core.epoch import epoch
from tests.unit.ckpt.support import clean_env, cli_command, run_cli

EPOCH = epoch(0, 4, 1)
ENV = {"DISPATCH_ATTEMPT": "att-1", "DISPATCH_EPOCH": str(EPOCH)}


@pytest.fixture
def ckpt(tmp_path: Path) -> Checkpoints:
    return Checkpoints.open(str(tmp_path / "root"), ENV)


def exec_dir(ckpt: Checkpoints) -> Path:
    return Path(ckpt.exec_dir())


def hf_save(folder: Path, *, state: str | None) -> None:
    """Write a Hugging Face Trainer-style save; `state` is trainer_state.json's text."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    (folder / "optimizer.pt").write_bytes(b"\1" * 64)
    if state is not None:
        (folder / "trainer_state.json").write_text(state)


STATE = json.dumps({"global_step": 10, "log_history": [{"loss": 1.5, "step": 10}]})


def test_hf_save_is_published_once_trainer_state_is_written(ckpt: Checkpoints) -> None:
    watcher = Watcher(ckpt)
    folder = exec_dir(ckpt) / "checkpoint-10"
    hf_save(folder, state=None)
    assert watcher.scan() == []
    assert ckpt.latest() is None
    # trainer_state.json half-written: not complete yet.
    for cut in (0, 1, len(STATE) // 2, len(STATE) - 1):
        (folder / "trainer_state.json").write_text(STATE[:cut])
        assert watcher.scan() == []
    assert ckpt.latest() is None
    (folder / "trainer_state.json").write_text(STATE)
    made = watcher.scan()
    assert made == [Publication(epoch=EPOCH, step=10, path="exec/att-1/checkpoint-10")]
    assert ckpt.latest() == made[0]
    assert watcher.scan() == []  # published once


def test_inner_folders_of_an_unfinished_hf_save_are_not_published(ckpt: Checkpoints) -> None:
    folder = exec_dir(ckpt) / "checkpoint-20"
    hf_save(folder, state=None)
    # An FSDP sharded state inside the HF save has its own DCP .metadata: not a save alone.
    (folder / "pytorch_model_fsdp_0").mkdir()
    (folder / "pytorch_model_fsdp_0" / ".metadata").write_bytes(b"x")
    staging = exec_dir(ckpt) / "tmp-checkpoint-30"
    (staging / "inner-30").mkdir(parents=True)
    (staging / "inner-30" / ".metadata").write_bytes(b"x")
    assert Watcher(ckpt).scan() == []


def test_framework_markers(ckpt: Checkpoints) -> None:
    top = exec_dir(ckpt)
    # PyTorch DCP: .metadata is renamed into place last.
    (top / "dcp" / "step-20").mkdir(parents=True)
    (top / "dcp" / "step-20" / "__0_0.distcp").write_bytes(b"x")
    (top / "dcp" / "step-20" / ".metadata").write_bytes(b"x")
    (top / "dcp" / "step-25").mkdir()
    (top / "dcp" / "step-25" / ".metadata.tmp").write_bytes(b"x")  # not yet renamed
    # Orbax: an unfinished rename, a committed step, a commit-file step, an uncommitted one.
    orbax = top / "orbax"
    (orbax / "40.orbax-checkpoint-tmp-1700000000").mkdir(parents=True)
    (orbax / "40.orbax-checkpoint-tmp-1700000000" / "_CHECKPOINT_METADATA").write_text(
        json.dumps({"init_timestamp_nsecs": 1, "commit_timestamp_nsecs": 2})
    )
    (orbax / "41").mkdir()
    (orbax / "41" / "_CHECKPOINT_METADATA").write_text(
        json.dumps({"init_timestamp_nsecs": 1, "commit_timestamp_nsecs": 2})
    )
    (orbax / "41" / "default").mkdir()
    (orbax / "41" / "default" / "_METADATA").write_text("{}")
    (orbax / "50").mkdir()
    (orbax / "50" / "commit_success.txt").write_text("Checkpoint commit was successful")
    (orbax / "60").mkdir()
    (orbax / "60" / "_CHECKPOINT_METADATA").write_text(json.dumps({"init_timestamp_nsecs": 1}))
    # A user marker, only with --marker.
    (top / "custom" / "epoch3_step70").mkdir(parents=True)
    (top / "custom" / "epoch3_step70" / "DONE").touch()

    saves = find_saves(ckpt.store, ckpt.exec_relpath())
    assert [(s.step, s.kind) for s in saves] == [
        (20, SaveKind.DCP),
        (41, SaveKind.ORBAX),
        (50, SaveKind.ORBAX),
    ]
    with_marker = find_saves(ckpt.store, ckpt.exec_relpath(), marker="DONE")
    assert (70, SaveKind.MARKER) in [(s.step, s.kind) for s in with_marker]
    made = Watcher(ckpt, marker="DONE").scan()
    assert [(p.step, p.path) for p in made] == [
        (20, "exec/att-1/dcp/step-20"),
        (41, "exec/att-1/orbax/41"),
        (50, "exec/att-1/orbax/50"),
        (70, "exec/att-1/custom/epoch3_step70"),
    ]


def test_complete_save_without_a_step_in_its_name_is_an_error(ckpt: Checkpoints) -> None:
    (exec_dir(ckpt) / "final").mkdir()
    (exec_dir(ckpt) / "final" / ".metadata").write_bytes(b"x")
    with pytest.raises(UnknownStep, match="final"):
        Watcher(ckpt).scan()


def test_a_restarted_watch_does_not_publish_again(ckpt: Checkpoints) -> None:
    hf_save(exec_dir(ckpt) / "checkpoint-10", state=STATE)
    assert len(Watcher(ckpt).scan()) == 1
    hf_save(exec_dir(ckpt) / "checkpoint-20", state=STATE)
    made = Watcher(ckpt).scan()
    assert [p.step for p in made] == [20]


def test_a_save_published_by_someone_else_meanwhile_is_an_error(ckpt: Checkpoints) -> None:
    watcher = Watcher(ckpt)
    watcher.scan()
    folder = exec_dir(ckpt) / "checkpoint-10"
    hf_save(folder, state=STATE)
    ckpt.publish(10, str(folder))
    with pytest.raises(AlreadyPublished):
        watcher.scan()


def test_store_error_ends_watch(ckpt: Checkpoints, tmp_path: Path) -> None:
    hf_save(exec_dir(ckpt) / "checkpoint-10", state=STATE)
    (tmp_path / "root" / "pub").write_text("a file where pub/ should be")
    with pytest.raises(StoreError):
        Watcher(ckpt).scan()


def test_saves_rotated_away_before_publication_are_not_errors(tmp_path: Path) -> None:
    class Rotating(PosixStore):
        """Deletes the save between the scan and the publication, as a rotation would."""

        def exists(self, relpath: str) -> bool:
            target = Path(self.location(relpath))
            for f in target.iterdir():
                f.unlink()
            target.rmdir()
            return super().exists(relpath)

    ckpt = Checkpoints(Rotating(tmp_path), Checkpoints.open(str(tmp_path), ENV).env)
    hf_save(exec_dir(ckpt) / "checkpoint-10", state=STATE)
    assert Watcher(ckpt).scan() == []
    assert ckpt.latest() is None


# --- the CLI, as a job script runs it ---------------------------------------------------


def wait_for_line(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = proc.stdout.readline()
    assert line, f"watch ended early: {proc.poll()}"
    assert time.monotonic() < deadline
    return line


def test_cli_watch_publishes_complete_saves_and_stops_cleanly(tmp_path: Path) -> None:
    root = tmp_path / "root"
    top = root / "exec" / "att-1"
    proc = subprocess.Popen(
        cli_command("watch", "--root", str(root), "--interval", "0.1"),
        env=clean_env(ENV),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        hf_save(top / "checkpoint-5", state=STATE[:10])  # half-written
        hf_save(top / "checkpoint-10", state=STATE)
        line = wait_for_line(proc)
        assert json.loads(line) == {"epoch": EPOCH, "step": 10, "path": str(top / "checkpoint-10")}
        (top / "checkpoint-5" / "trainer_state.json").write_text(STATE)
        line = wait_for_line(proc)
        assert json.loads(line)["step"] == 5
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    latest = Checkpoints.open(str(root)).latest()
    assert latest is not None
    assert latest.step == 10


def test_cli_watch_exits_non_zero_at_the_first_store_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    hf_save(root / "exec" / "att-1" / "checkpoint-10", state=STATE)
    (root / "pub").write_text("a file where pub/ should be")
    proc = subprocess.run(
        cli_command("watch", "--root", str(root), "--interval", "0.1"),
        env=clean_env(ENV),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "dispatch-ckpt: error:" in proc.stderr
    assert "pub" in proc.stderr


def test_cli_watch_exits_non_zero_when_the_root_is_unusable(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.write_text("a file, not a folder")
    result = run_cli("watch", "--root", str(root), env=ENV)
    assert result.returncode == 1
    assert "create folder" in result.stderr


def test_cli_watch_refuses_to_run_without_the_execution_identity(tmp_path: Path) -> None:
    result = run_cli("watch", "--root", str(tmp_path), "--once")
    assert result.returncode == 1
    assert "DISPATCH_EPOCH is not set" in result.stderr
    result = run_cli("watch", "--root", str(tmp_path), "--once", env={"DISPATCH_EPOCH": "1000000"})
    assert result.returncode == 1
    assert "DISPATCH_ATTEMPT is not set" in result.stderr


def test_cli_watch_once_with_marker(tmp_path: Path) -> None:
    root = tmp_path / "root"
    folder = root / "exec" / "att-1" / "run" / "step_00300"
    folder.mkdir(parents=True)
    (folder / "READY").touch()
    result = run_cli("watch", "--root", str(root), "--once", "--marker", "READY", env=ENV)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["step"] == 300
    assert os.listdir(root / "pub")
