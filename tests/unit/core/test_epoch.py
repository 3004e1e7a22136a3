"""The epoch: ``DISPATCH_EPOCH = G*10^12 + N*10^6 + R`` and its bounds (seed 004, "The epoch
orders executions")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch_core import MAX_EPOCH, MAX_GENERATION, EpochOutOfRange, epoch, split_epoch

GENERATIONS = st.integers(0, MAX_GENERATION)
SUBMISSIONS = st.integers(1, 999_999)
RESTARTS = st.integers(0, 999_999)


def test_epoch_is_generation_then_submission_then_restart() -> None:
    """ "DISPATCH_EPOCH = G x 10^12 + N x 10^6 + R"."""
    assert epoch(0, 1, 0) == 1_000_000
    assert epoch(2, 3, 4) == 2_000_003_000_004
    assert epoch(MAX_GENERATION, 999_999, 999_999) == MAX_EPOCH
    assert len(str(MAX_EPOCH)) <= 20  # a publication prints it in 20 digits


@pytest.mark.parametrize(
    ("generation", "submission", "restart", "component"),
    [
        (0, 0, 0, "submission"),
        (0, 1_000_000, 0, "submission"),
        (0, 1, -1, "restart"),
        (0, 1, 1_000_000, "restart"),
        (-1, 1, 0, "generation"),
        (MAX_GENERATION + 1, 1, 0, "generation"),
    ],
)
def test_epoch_refuses_values_outside_the_bounds(
    generation: int, submission: int, restart: int, component: str
) -> None:
    """ "N is the submission number, 1 to 999,999; R ... 0 to 999,999"; "model.Epoch computes
    it and refuses values outside those bounds". The error names the component."""
    with pytest.raises(EpochOutOfRange, match=component) as err:
        epoch(generation, submission, restart)
    assert err.value.component == component


def test_epoch_refuses_a_bool_or_a_float() -> None:
    with pytest.raises(TypeError, match="submission"):
        epoch(0, True, 0)
    with pytest.raises(TypeError, match="restart"):
        epoch(0, 1, 0.0)  # type: ignore[arg-type]


@given(GENERATIONS, SUBMISSIONS, RESTARTS)
def test_split_epoch_inverts_epoch(generation: int, submission: int, restart: int) -> None:
    assert split_epoch(epoch(generation, submission, restart)) == (generation, submission, restart)


@given(GENERATIONS, SUBMISSIONS, RESTARTS, st.sampled_from(["generation", "submission", "restart"]))
def test_each_of_supersede_resubmit_and_requeue_raises_the_epoch(
    generation: int, submission: int, restart: int, which: str
) -> None:
    """ "A resubmission raises N, a requeue raises R, and a supersession raises G, so each
    raises the epoch" — whatever the other components of the later execution are, as long as
    the raised component is higher (a resubmission resets R, a supersession restarts N)."""
    before = epoch(generation, submission, restart)
    if which == "generation" and generation < MAX_GENERATION:
        assert epoch(generation + 1, 1, 0) > before
    if which == "submission" and submission < 999_999:
        assert epoch(generation, submission + 1, 0) > before
    if which == "restart" and restart < 999_999:
        assert epoch(generation, submission, restart + 1) > before


def test_split_epoch_refuses_what_epoch_could_not_produce() -> None:
    with pytest.raises(EpochOutOfRange, match="submission"):
        split_epoch(5)  # N = 0
    with pytest.raises(EpochOutOfRange, match="epoch"):
        split_epoch(MAX_EPOCH + 1)
