"""The overlap harness on POSIX (seed 004, "Publication is append-only"): an old execution
stalled mid-publication resumes and publishes late while a replacement with a higher epoch
saves and publishes. 1,000 trials; none may let latest() return the old lineage after the
replacement published."""

from __future__ import annotations

from pathlib import Path

from dispatch_ckpt.overlap import Design, Stage, run_trial, run_trials
from dispatch_ckpt.posix import PosixStore


def test_append_only_publication_loses_no_trial_in_1000(tmp_path: Path) -> None:
    result = run_trials(lambda i: PosixStore(tmp_path / f"t{i}"), 1000, seed=4)
    assert result.trials == 1000
    assert result.lost == 0
    # The trials did exercise the hard case: the old run's publication landing after the
    # replacement's (the stages after the replacement's publication always do).
    assert result.late >= 400


def test_every_stage_is_safe(tmp_path: Path) -> None:
    for stage in Stage:
        assert not run_trial(PosixStore(tmp_path / stage.name), stage, design=Design.APPEND_ONLY), (
            stage
        )


def test_the_harness_catches_check_then_rename(tmp_path: Path) -> None:
    # The design the seed rejects loses whenever the old run resumes after the replacement
    # published: the harness exists to see exactly that.
    assert run_trial(
        PosixStore(tmp_path / "ctr"), Stage.AFTER_PUBLISH, design=Design.CHECK_THEN_RENAME
    )
    result = run_trials(
        lambda i: PosixStore(tmp_path / f"ctr{i}"), 50, design=Design.CHECK_THEN_RENAME
    )
    assert result.lost >= 20  # at least the 20 trials resuming after the publication
