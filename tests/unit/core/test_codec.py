"""The codec: every type survives a round-trip; enums go on the wire by name; what a decoder
doesn't understand is refused with an error naming it (seed 000, "Refusing what it doesn't
understand")."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch_core import (
    Action,
    Actor,
    ActorKind,
    Cancel,
    CauseKind,
    Declarations,
    DecodeError,
    Discovery,
    JobEvent,
    OperatorCommand,
    OutcomeCommitted,
    State,
    decode,
    decode_command,
    decode_event,
    decode_step,
    encode,
)
from tests.unit.core.strategies import ROUND_TRIP, any_events, commands, steps

_OUTCOME = (
    b'{"type":"outcome.committed","job_id":"j1","at":"2026-01-01T00:00:00Z",'
    b'"state":"failed","cause":{"kind":"%s","provenance":"scheduler"}}'
)


@pytest.mark.parametrize("name", sorted(ROUND_TRIP))
@given(data=st.data())
def test_every_type_survives_a_round_trip(name: str, data: st.DataObject) -> None:
    """Every event, Discovery, Status, Job, step, command, Plan... decodes to itself."""
    type_, strategy = ROUND_TRIP[name]
    value = data.draw(strategy)
    assert decode(encode(value), type_) == value


@given(any_events)
def test_an_event_decodes_as_its_own_type_and_as_the_union(event: JobEvent) -> None:
    data = encode(event)
    assert decode(data, type(event)) == event
    assert decode_event(data) == event


@given(commands)
def test_a_command_round_trips_through_decode_command(command: OperatorCommand) -> None:
    assert decode_command(encode(command)) == command


@given(steps)
def test_a_step_round_trips_through_decode_step(step: Any) -> None:
    assert decode_step(encode(step)) == step


def test_every_state_and_cause_kind_encodes_as_the_seeds_name() -> None:
    """ "Every state, cause kind and other enum encodes as its name" (seed 000)."""
    assert [s.value for s in State] == [
        "pending", "held", "running", "recovering", "succeeded", "failed", "cancelled", "unknown",
    ]  # fmt: skip
    assert [k.value for k in CauseKind] == [
        "none", "preempted", "node-lost", "out-of-memory", "time-limit", "non-zero-exit",
        "launch-failed", "no-capacity", "held", "released", "requeued", "cancelled",
        "duplicate", "unknown",
    ]  # fmt: skip
    assert encode(CauseKind.NODE_LOST) == b'"node-lost"'
    assert encode(State.RECOVERING) == b'"recovering"'


def test_decoding_refuses_a_cause_kind_it_does_not_know() -> None:
    """ "decoding refuses a name it doesn't know. A record written by a newer build that
    added a cause is refused by an older one, rather than misread" (seed 000)."""
    assert decode_event(_OUTCOME % b"preempted").cause.kind is CauseKind.PREEMPTED  # type: ignore[union-attr]
    with pytest.raises(DecodeError, match=r"'evicted'.*\$\.cause\.kind") as err:
        decode_event(_OUTCOME % b"evicted")
    assert err.value.what == "event"


def test_decoding_refuses_an_event_type_it_does_not_know() -> None:
    data = b'{"type":"job.teleported","job_id":"j1","at":"2026-01-01T00:00:00Z"}'
    with pytest.raises(DecodeError, match=r"unknown event type 'job.teleported'"):
        decode_event(data)


def test_decoding_refuses_a_value_of_the_wrong_type_naming_its_path() -> None:
    data = (
        b'{"type":"launch.intended","job_id":"j1","at":"2026-01-01T00:00:00Z",'
        b'"submission":"two","attempt":1}'
    )
    with pytest.raises(DecodeError, match=r"Expected `int`, got `str` - at `\$\.submission`"):
        decode_event(data)


def test_decoding_refuses_a_time_without_a_timezone() -> None:
    data = b'{"cluster":"c","job_id":"j1","seen_at":"2026-01-01T00:00:00"}'
    with pytest.raises(DecodeError, match=r"\$\.seen_at"):
        decode(data, Discovery)


def test_decoding_refuses_text_that_is_not_json() -> None:
    with pytest.raises(DecodeError, match="cannot decode event"):
        decode_event(b'{"type":')


def test_decoding_refuses_an_unknown_action_in_declarations() -> None:
    data = b'{"node_loss_window_s":60,"native_actions":["requeue","reboot"]}'
    with pytest.raises(DecodeError, match=r"'reboot'.*\$\.native_actions\[1\]"):
        decode(data, Declarations)


def test_an_event_with_a_field_this_build_does_not_know_still_decodes() -> None:
    """An old reader skips fields a newer writer added (STYLE.md: events never forbid
    unknown fields)."""
    data = (_OUTCOME % b"none")[:-1] + b',"added_later":{"x":1}}'
    event = decode_event(data)
    assert isinstance(event, OutcomeCommitted)
    assert event.state is State.FAILED


def test_a_command_with_a_field_no_command_has_is_refused() -> None:
    """Commands are API request bodies: a typo is refused, never defaulted."""
    by = b'"by":{"name":"alice","kind":"human"}'
    assert decode_command(b'{"command":"cancel",' + by + b',"reason":"x"}') == Cancel(
        by=Actor(name="alice", kind=ActorKind.HUMAN), reason="x"
    )
    with pytest.raises(DecodeError, match=r"unknown field - at `\$\.reasn`"):
        decode_command(b'{"command":"cancel",' + by + b',"reasn":"x"}')
    with pytest.raises(DecodeError, match=r"unknown field - at `\$\.by\.nam`"):
        decode_command(b'{"command":"cancel","by":{"nam":"a","name":"a","kind":"human"}}')
    with pytest.raises(DecodeError, match=r"unknown field - at `\$\.target\.submision`"):
        decode_command(b'{"command":"abandon",' + by + b',"target":{"submision":2}}')
    with pytest.raises(DecodeError, match=r"unknown command 'restart'"):
        decode_command(b'{"command":"restart",' + by + b"}")


def test_encoding_is_deterministic_for_sets() -> None:
    """The same value always gives the same bytes (sets are sorted)."""
    decl = Declarations(node_loss_window_s=1.0, native_actions=frozenset(Action))
    assert encode(decl) == encode(decode(encode(decl), Declarations))
    assert b'["escalate","hold","requeue","restart","resubmit"]' in encode(decl)
