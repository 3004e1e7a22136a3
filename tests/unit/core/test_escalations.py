"""The closed vocabularies (issue 11 item 3): the escalation table (seed 002, "Answer it by its
id"), its ids built and read back, and the ``why``/``how`` enums of the record, whose values are
the strings records already hold (golden lines written by the build before the enums)."""

from __future__ import annotations

import enum
import typing
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch_core import (
    ESCALATIONS,
    CauseKind,
    DecodeError,
    EscalationCommitted,
    EscalationKind,
    HoldHow,
    HoldReleased,
    InvalidEscalationId,
    OperatorCommand,
    Severity,
    StopRequested,
    StopWhy,
    SubmissionOpened,
    SubmissionWhy,
    decode_event,
    encode,
    escalation_id,
    escalation_info,
    escalation_kind,
    parse_escalation_id,
)
from tests.unit.core.test_histories import GOLDEN, _read

VOCABULARY = Path(__file__).parents[2] / "data" / "vocabulary" / "why-how-strings.jsonl"

# Every id shape the planner and decide commit, as records already hold them.
GOLDEN_IDS = [
    ("overdue:3", EscalationKind.OVERDUE, "3"),
    ("all-unknown:2", EscalationKind.ALL_UNKNOWN, "2"),
    ("unmatched:2/1", EscalationKind.UNMATCHED, "2/1"),
    ("foreign:9155", EscalationKind.FOREIGN, "9155"),
    ("foreign:slurm-a/9155", EscalationKind.FOREIGN, "slurm-a/9155"),
    ("admin-held:81234", EscalationKind.ADMIN_HELD, "81234"),
    ("failed:non-zero-exit", EscalationKind.FAILED, "non-zero-exit"),
    ("refused:1", EscalationKind.REFUSED, "1"),
    ("cleanup-deadline", EscalationKind.CLEANUP_DEADLINE, None),
    ("stop-overdue:dj-x-1-1", EscalationKind.STOP_OVERDUE, "dj-x-1-1"),
    ("give-up", EscalationKind.GIVE_UP, None),
    ("no-progress:3", EscalationKind.NO_PROGRESS, "3"),
]

MALFORMED_IDS = {
    "unknown prefix": ("evicted:1", "prefix"),
    "empty": ("", "prefix"),
    "number missing": ("overdue", "no argument"),
    "number empty": ("overdue:", "<instance>"),
    "number zero": ("all-unknown:0", "<N>"),
    "leading zero": ("refused:01", "<N>"),
    "sign": ("overdue:+1", "<instance>"),
    "unmatched without attempt": ("unmatched:2", "<N>/<a>"),
    "unmatched with letters": ("unmatched:2/a", "<N>/<a>"),
    "cause not in the list": ("failed:evicted", "<cause>"),
    "argument to a bare kind": ("give-up:1", "alone"),
    "argument to cleanup-deadline": ("cleanup-deadline:1", "alone"),
    "object id missing": ("foreign", "no argument"),
    "no-progress without N": ("no-progress", "no argument"),
}


def test_the_table_has_every_kind_once_with_its_prefix() -> None:
    assert list(ESCALATIONS) == list(EscalationKind)
    for kind, info in ESCALATIONS.items():
        assert info.kind is kind
        assert info.meaning
        assert info.advice


def test_the_prefixes_are_the_ids_records_hold() -> None:
    assert [k.value for k in EscalationKind] == [
        "overdue",
        "all-unknown",
        "unmatched",
        "foreign",
        "admin-held",
        "failed",
        "refused",
        "cleanup-deadline",
        "stop-overdue",
        "give-up",
        "no-progress",
    ]


def test_severities_are_the_notifiers_words() -> None:
    # Routes files already say @critical, @warning, @info.
    assert [s.value for s in Severity] == ["critical", "warning", "info"]
    by_severity = {
        s: {k.value for k, i in ESCALATIONS.items() if i.severity is s} for s in Severity
    }
    assert by_severity == {
        Severity.CRITICAL: {"failed", "refused", "cleanup-deadline", "stop-overdue"},
        Severity.WARNING: {
            "overdue",
            "all-unknown",
            "unmatched",
            "foreign",
            "admin-held",
            "no-progress",
        },
        Severity.INFO: {"give-up"},
    }


def test_answers_are_operator_commands_as_the_api_names_them() -> None:
    commands = {cls.__struct_config__.tag for cls in typing.get_args(OperatorCommand)} - {
        "submit",
        "hold",
    }
    for info in ESCALATIONS.values():
        assert set(info.answers) <= commands, info.kind
    assert ESCALATIONS[EscalationKind.OVERDUE].answers == (
        "release",
        "resubmit",
        "cancel",
        "give-up",
    )
    assert ESCALATIONS[EscalationKind.FOREIGN].answers == ("abandon",)
    assert ESCALATIONS[EscalationKind.FAILED].answers == ("supersede",)
    assert ESCALATIONS[EscalationKind.GIVE_UP].answers == ()
    assert ESCALATIONS[EscalationKind.NO_PROGRESS].answers == ("resubmit", "give-up", "cancel")


def test_id_formats_read_as_seed_002_writes_them() -> None:
    formats = {k.value: i.id_format for k, i in ESCALATIONS.items()}
    assert formats["overdue"] == "overdue:<instance>"
    assert formats["unmatched"] == "unmatched:<N>/<a>"
    assert formats["foreign"] == "foreign:<object id>"
    assert formats["cleanup-deadline"] == "cleanup-deadline"
    assert formats["no-progress"] == "no-progress:<N>"


@pytest.mark.parametrize(("text", "kind", "arg"), GOLDEN_IDS, ids=[g[0] for g in GOLDEN_IDS])
def test_golden_ids_parse_and_build(text: str, kind: EscalationKind, arg: str | None) -> None:
    assert parse_escalation_id(text) == (kind, arg)
    assert escalation_id(kind, arg) == text
    assert escalation_kind(text) is kind
    info = escalation_info(text)
    assert info is not None
    assert info.kind is kind


def test_ids_build_from_typed_arguments() -> None:
    assert escalation_id(EscalationKind.OVERDUE, 3) == "overdue:3"
    assert escalation_id(EscalationKind.UNMATCHED, (2, 1)) == "unmatched:2/1"
    assert escalation_id(EscalationKind.FAILED, CauseKind.OUT_OF_MEMORY) == "failed:out-of-memory"
    assert escalation_id(EscalationKind.GIVE_UP) == "give-up"


@pytest.mark.parametrize(("text", "words"), list(MALFORMED_IDS.values()), ids=list(MALFORMED_IDS))
def test_a_malformed_id_is_refused_naming_it(text: str, words: str) -> None:
    with pytest.raises(InvalidEscalationId) as info:
        parse_escalation_id(text)
    assert info.value.escalation_id == text
    assert repr(text) in str(info.value)
    assert words in str(info.value)
    assert escalation_kind(text) is None
    assert escalation_info(text) is None


def test_building_a_wrong_argument_is_refused() -> None:
    with pytest.raises(InvalidEscalationId, match="overdue:0"):
        escalation_id(EscalationKind.OVERDUE, 0)
    with pytest.raises(InvalidEscalationId, match="'give-up:x'"):
        escalation_id(EscalationKind.GIVE_UP, "x")
    with pytest.raises(InvalidEscalationId, match="no argument"):
        escalation_id(EscalationKind.REFUSED)


positive = st.integers(min_value=1, max_value=10**9)
object_ids = st.text(min_size=1, max_size=30)
arguments: dict[EscalationKind, st.SearchStrategy[str | int | tuple[int, int] | None]] = {
    EscalationKind.OVERDUE: positive,
    EscalationKind.ALL_UNKNOWN: positive,
    EscalationKind.UNMATCHED: st.tuples(positive, positive),
    EscalationKind.FOREIGN: object_ids,
    EscalationKind.ADMIN_HELD: object_ids,
    EscalationKind.FAILED: st.sampled_from(CauseKind),
    EscalationKind.REFUSED: positive,
    EscalationKind.CLEANUP_DEADLINE: st.none(),
    EscalationKind.STOP_OVERDUE: object_ids,
    EscalationKind.GIVE_UP: st.none(),
    EscalationKind.NO_PROGRESS: positive,
}
built = st.sampled_from(EscalationKind).flatmap(
    lambda kind: arguments[kind].map(lambda arg: (kind, arg))
)


def test_every_kind_has_an_argument_strategy() -> None:
    assert set(arguments) == set(EscalationKind)


@given(built)
def test_id_parse_id_round_trip(
    pair: tuple[EscalationKind, str | int | tuple[int, int] | None],
) -> None:
    kind, arg = pair
    text = escalation_id(kind, arg)
    parsed_kind, parsed_arg = parse_escalation_id(text)
    assert parsed_kind is kind
    assert escalation_id(parsed_kind, parsed_arg) == text
    assert text.startswith(kind.value)


@given(st.text(max_size=40) | st.sampled_from([g[0] for g in GOLDEN_IDS]))
def test_any_text_parses_back_to_itself_or_is_refused(text: str) -> None:
    kind = escalation_kind(text)
    if kind is None:
        with pytest.raises(InvalidEscalationId) as info:
            parse_escalation_id(text)
        assert info.value.escalation_id == text
    else:
        assert escalation_id(*parse_escalation_id(text)) == text


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_every_escalation_in_the_golden_records_parses(name: str) -> None:
    ids = [ev.id for _, ev in _read(name) if isinstance(ev, EscalationCommitted)]
    for text in ids:
        parse_escalation_id(text)


# -- why / how ------------------------------------------------------------------------------

_FIELDS: dict[type[msgspec.Struct], tuple[str, type[object]]] = {
    SubmissionOpened: ("why", SubmissionWhy),
    StopRequested: ("why", StopWhy),
    HoldReleased: ("how", HoldHow),
}


def _golden_lines() -> list[bytes]:
    return VOCABULARY.read_bytes().splitlines()


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    seq: int
    event: msgspec.Raw


def test_old_why_and_how_strings_decode_to_the_enums() -> None:
    seen: dict[type[object], set[object]] = {SubmissionWhy: set(), StopWhy: set(), HoldHow: set()}
    for text in _golden_lines():
        raw = msgspec.json.decode(text, type=_Line).event
        event = decode_event(raw)
        field, enum = _FIELDS[type(event)]
        value = getattr(event, field)
        assert type(value) is enum
        seen[enum].add(value)
        # Written again, it is what the old build wrote: the same fields and values, in the
        # same order, plus only fields added since, at their defaults (``cluster``, issue 14).
        old = msgspec.json.decode(bytes(raw))
        new = msgspec.json.decode(encode(event))
        assert list(new)[: len(old)] == list(old)
        assert {k: new[k] for k in old} == old
        assert all(new[k] is None for k in new if k not in old)
    assert seen == {SubmissionWhy: set(SubmissionWhy), StopWhy: set(StopWhy), HoldHow: set(HoldHow)}


@pytest.mark.parametrize(
    ("vocabulary", "values"),
    [
        (SubmissionWhy, ["initial", "recovery", "resubmit", "abandoned", "ceased"]),
        (StopWhy, ["cancel", "fence", "duplicate", "outcome", "recovery", "no-capacity"]),
        (
            HoldHow,
            ["release", "resubmit", "cancel", "give-up", "ceased", "outcome", "replaced"],
        ),
    ],
    ids=["SubmissionOpened.why", "StopRequested.why", "HoldReleased.how"],
)
def test_enum_values_are_todays_strings(vocabulary: type[enum.StrEnum], values: list[str]) -> None:
    assert [m.value for m in vocabulary] == values
    for value in values:
        assert str(vocabulary(value)) == value
        assert f"{vocabulary(value)}" == value
        assert vocabulary(value) == value


def test_an_unknown_why_is_refused_not_defaulted() -> None:
    line = _golden_lines()[0].replace(b'"why":"initial"', b'"why":"evicted"')
    raw = msgspec.json.decode(line, type=_Line).event
    with pytest.raises(DecodeError, match="evicted"):
        decode_event(raw)
