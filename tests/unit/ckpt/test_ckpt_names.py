"""Publication names (seed 004, "Publication is append-only" and "The epoch orders
executions"): golden names, the reverse parse, malformed names, ordering; Hypothesis
properties for the round trip and for latest()."""

from __future__ import annotations

import base64
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch_ckpt import InvalidStep, MalformedName, NameTooLong, Publication
from dispatch_ckpt.names import MAX_STEP, decode_path, encode_name, encode_path, latest, parse_name
from dispatch_core.epoch import MAX_GENERATION, MAX_RESTART, MAX_SUBMISSION, epoch
from dispatch_core.errors import EpochOutOfRange

GOLDEN = [
    (
        epoch(0, 1, 0),
        0,
        "exec/a1/checkpoint-0",
        "00000000000001000000-00000000000000000000-MV4GKYZPMEYS6Y3IMVRWW4DPNFXHILJQ",
    ),
    (
        epoch(0, 3, 2),
        500,
        "exec/job-7.2/step-500",
        "00000000000003000002-00000000000000000500-MV4GKYZPNJXWELJXFYZC643UMVYC2NJQGA",
    ),
    (
        epoch(1, 1, 0),
        MAX_STEP,
        "x",  # 0x78 = 01111 000(00) -> P A
        "00000001000001000000-99999999999999999999-PA",
    ),
    (
        epoch(MAX_GENERATION, MAX_SUBMISSION, MAX_RESTART),
        7,
        "exec/é/ü.pt",
        "99999999999999999999-00000000000000000007-MV4GKYZPYOUS7Q54FZYHI",
    ),
]

B32 = re.compile(r"[A-Z2-7]*")


@pytest.mark.parametrize(("ep", "step", "path", "name"), GOLDEN)
def test_golden_names(ep: int, step: int, path: str, name: str) -> None:
    assert encode_name(ep, step, path) == name
    assert Publication(epoch=ep, step=step, path=path).name == name


@pytest.mark.parametrize(("ep", "step", "path", "name"), GOLDEN)
def test_golden_names_parse_back(ep: int, step: int, path: str, name: str) -> None:
    assert parse_name(name) == Publication(epoch=ep, step=step, path=path)


@pytest.mark.parametrize("path", ["a", "a-b-c", "A-B/c_d.E", "exec/ü/ß-Ω", "x" * 130])
def test_base32_path_has_no_dash_and_one_case(path: str) -> None:
    text = encode_path(path)
    assert "-" not in text
    assert "=" not in text
    assert B32.fullmatch(text)
    assert text == text.upper()
    # Same bytes as the standard alphabet, padding dropped.
    assert text == base64.b32encode(path.encode()).decode().rstrip("=")
    assert decode_path(text) == path


def test_case_folding_cannot_merge_two_names() -> None:
    # Paths differing only by case encode to different (upper-case) texts.
    a, b = encode_path("exec/a/Step"), encode_path("exec/a/step")
    assert a != b
    assert a.lower() != b.lower()


GOOD = GOLDEN[0][3]
GOOD_PATH = GOOD[42:]
MALFORMED = {
    "epoch with 19 digits": ("0" * 18 + "1-" + "0" * 20 + "-" + GOOD_PATH, "epoch as 20 digits"),
    "step with 21 digits": (
        "00000000000001000000-" + "0" * 21 + "-" + GOOD_PATH,
        "step as 20 digits",
    ),
    "letter in the epoch": ("0000000000000100000x-" + "0" * 20 + "-" + GOOD_PATH, "epoch"),
    "non-ASCII digit in the step": (
        "00000000000001000000-" + "0" * 19 + "\u0661-" + GOOD_PATH,
        "step",
    ),
    "sign in the step": ("00000000000001000000-+" + "0" * 19 + "-" + GOOD_PATH, "step"),
    "lower-case base32": (GOOD[:42] + GOOD_PATH.lower(), "upper-case"),
    "mixed-case base32": (GOOD[:42] + GOOD_PATH[:-1] + GOOD_PATH[-1].lower(), "upper-case"),
    "padding": (GOOD[:42] + "ME======", "padding"),
    "extra '-' in the path": (GOOD[:42] + "MV4G-KYZP", "3 fields"),
    "extra leading field": ("1-" + GOOD, "3 fields"),
    "no path": (GOOD[:41], "3 fields"),
    "empty path": (GOOD[:42], "nothing after the step"),
    "not base32 at all": (GOOD[:42] + "MV4G1KYZ", "'1'"),
    "impossible base32 length": (GOOD[:42] + "MEA", "length"),
    "non-canonical trailing bits": (GOOD[:42] + "PB", "canonical"),
    "bytes that are not UTF-8": (GOOD[:42] + "74", "UTF-8"),
    "path with '..'": (GOOD[:42] + encode_path("exec/../x"), "'..'"),
    "absolute path": (GOOD[:42] + encode_path("/etc/x"), "relative"),
    "epoch with submission 0": ("00000000000000000005-" + GOOD[21:], "submission"),
    "a stray file": ("notes.txt", "3 fields"),
    "a temporary name": (GOOD + ".tmp", "base32"),
}


@pytest.mark.parametrize(("entry", "words"), list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_name_is_an_error_naming_it(entry: str, words: str) -> None:
    with pytest.raises(MalformedName) as info:
        parse_name(entry)
    assert info.value.entry == entry
    assert repr(entry) in str(info.value)
    assert words in str(info.value)


def _readable(entry: str) -> bool:
    # Its own 20-digit epoch and step can be read: "<20 digits>-<20 digits>-".
    return re.match(r"[0-9]{20}-[0-9]{20}-", entry, flags=re.ASCII) is not None


UNREADABLE = {k: v for k, v in MALFORMED.items() if not _readable(v[0])}
READABLE = {k: v for k, v in MALFORMED.items() if _readable(v[0])}
# Each READABLE malformation with an epoch and step above every name of _good(): it would win.
HIGH = "00000000000009000000-00000000000000000099-"
COULD_WIN = {
    name: ("00000009000000000000-" + entry[21:] if "submission" in words else HIGH + entry[42:])
    for name, (entry, words) in READABLE.items()
}


def _good(n: int = 1) -> list[str]:
    return [encode_name(epoch(0, n, 0), s, f"exec/a/step-{s}") for s in range(5)]


def _placements(good: list[str], entry: str) -> list[list[str]]:
    return [[*good, entry], [entry, *good], [*good[:2], entry, *good[2:]]]


def _same_refusal(entries: list[str], entry: str) -> None:
    with pytest.raises(MalformedName) as info:
        latest(entries)
    assert info.value.entry == entry
    with pytest.raises(MalformedName) as alone:
        parse_name(entry)
    assert str(info.value) == str(alone.value)  # the same error as parsing it alone


def test_every_malformation_is_tried_as_a_name_that_could_win() -> None:
    assert set(UNREADABLE) | set(READABLE) == set(MALFORMED)
    assert UNREADABLE
    assert READABLE
    for name, entry in COULD_WIN.items():
        assert entry > max(_good()), name


@pytest.mark.parametrize(("entry", "words"), list(UNREADABLE.values()), ids=list(UNREADABLE))
def test_latest_never_skips_a_name_whose_epoch_and_step_cant_be_read(
    entry: str, words: str
) -> None:
    # It could be the latest wherever it sorts, however many good names surround it.
    for entries in _placements(_good(), entry):
        _same_refusal(entries, entry)


@pytest.mark.parametrize("entry", list(COULD_WIN.values()), ids=list(COULD_WIN))
def test_latest_refuses_a_malformed_name_that_could_win(entry: str) -> None:
    for entries in _placements(_good(), entry):
        _same_refusal(entries, entry)


@pytest.mark.parametrize(("entry", "words"), list(READABLE.values()), ids=list(READABLE))
def test_latest_passes_over_a_malformed_name_its_own_digits_put_below_the_winner(
    entry: str, words: str
) -> None:
    # Issue 11 item 7: only the names that could win are parsed. This one's epoch and step
    # (fixed-width digits) are below the winner's, so whatever follows them it can't be the
    # latest one; parse_name still refuses it.
    good = _good(2)
    assert entry < min(good)
    for entries in _placements(good, entry):
        assert latest(entries) == parse_name(max(good))


def test_a_malformed_name_tied_with_the_winner_is_refused_when_it_sorts_above_it() -> None:
    winner = encode_name(epoch(0, 1, 0), 7, "exec/a/M")  # path text JVSXGYZPMEXU2
    above = winner[:42] + "ZZ"  # same epoch and step, greater name: it would win the tie
    below = winner[:42] + "AB"  # same epoch and step, smaller name: it loses the tie
    assert below < winner < above
    _same_refusal([winner, above], above)
    assert latest([below, winner]) == parse_name(winner)


def test_latest_of_nothing_is_none() -> None:
    assert latest([]) is None


def test_lower_epoch_with_higher_step_never_outranks() -> None:
    old = encode_name(epoch(0, 1, 0), 10**19, "exec/old/checkpoint-huge")
    new = encode_name(epoch(0, 2, 0), 1, "exec/new/checkpoint-1")
    requeued = encode_name(epoch(0, 1, 1), 2, "exec/requeued/checkpoint-2")
    assert latest([old, requeued]) == parse_name(requeued)
    assert latest([old, new, requeued]) == parse_name(new)
    assert latest([new, requeued, old]) == parse_name(new)


def test_superseding_generation_outranks_every_save_of_the_old_job() -> None:
    newest_of_old = epoch(0, MAX_SUBMISSION, MAX_RESTART)
    first_of_new = epoch(1, 1, 0)
    old = [encode_name(newest_of_old, MAX_STEP, "exec/old/final")]
    old += [encode_name(epoch(0, n, 0), 10**6, f"exec/o{n}/s") for n in range(1, 20)]
    # Until it publishes, the superseding job resumes from the old job's latest save...
    assert latest(old) == parse_name(old[0])
    # ...and from its first publication on, its own saves win, whatever their step.
    mine = encode_name(first_of_new, 0, "exec/new/checkpoint-0")
    assert latest([*old, mine]) == parse_name(mine)


def test_ties_in_epoch_and_step_are_broken_by_name_not_listing_order() -> None:
    a = encode_name(epoch(0, 1, 0), 5, "exec/a/x")
    b = encode_name(epoch(0, 1, 0), 5, "exec/a/y")
    assert latest([a, b]) == latest([b, a]) == parse_name(max(a, b))


@pytest.mark.parametrize("step", [-1, MAX_STEP + 1, True, 1.0])
def test_step_outside_twenty_digits_is_refused(step: int) -> None:
    with pytest.raises(InvalidStep):
        encode_name(epoch(0, 1, 0), step, "exec/a/x")


def test_epoch_outside_the_core_bounds_is_refused() -> None:
    with pytest.raises(EpochOutOfRange):
        encode_name(5, 1, "exec/a/x")  # submission 0


@pytest.mark.parametrize("path", ["", "/abs", "a//b", "a/./b", "a/../b", "a/", "a\x00b"])
def test_unclean_paths_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match="save path"):
        encode_name(epoch(0, 1, 0), 1, path)


def test_names_longer_than_255_bytes_are_refused() -> None:
    encode_name(epoch(0, 1, 0), 1, "x" * 133)  # 42 + 213 = 255
    with pytest.raises(NameTooLong) as info:
        encode_name(epoch(0, 1, 0), 1, "x" * 134)
    assert info.value.length == 257


# --- Hypothesis properties ------------------------------------------------------------

epochs = st.builds(
    epoch,
    st.integers(0, MAX_GENERATION),
    st.integers(1, MAX_SUBMISSION),
    st.integers(0, MAX_RESTART),
)
steps = st.integers(0, MAX_STEP)
components = st.text(
    alphabet=st.characters(blacklist_characters="/\x00", blacklist_categories=["Cs"]),
    min_size=1,
    max_size=12,
).filter(lambda c: c not in (".", ".."))
paths = st.lists(components, min_size=1, max_size=4).map("/".join)


@settings(max_examples=300, deadline=None)
@given(epochs, steps, paths)
def test_name_round_trip(ep: int, step: int, path: str) -> None:
    try:
        name = encode_name(ep, step, path)
    except NameTooLong:
        assert len(f"{ep:020d}-{step:020d}-{encode_path(path)}") > 255
        return
    assert parse_name(name) == Publication(epoch=ep, step=step, path=path)
    assert name.count("-") == 2
    assert B32.fullmatch(name[42:])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(epochs, steps, paths), min_size=1, max_size=30), st.randoms())
def test_latest_is_greatest_epoch_then_step(
    pubs: list[tuple[int, int, str]], rnd: random.Random
) -> None:
    names = []
    for ep, step, path in pubs:
        try:
            names.append(encode_name(ep, step, path))
        except NameTooLong:
            continue
    if not names:
        return
    best = latest(names)
    assert best is not None
    parsed = [parse_name(n) for n in names]
    top = max((p.epoch, p.step) for p in parsed)
    assert (best.epoch, best.step) == top
    # Listing order never matters.
    shuffled = list(names)
    rnd.shuffle(shuffled)
    assert latest(shuffled) == best


@settings(max_examples=200, deadline=None)
@given(epochs, epochs, steps, steps)
def test_a_lower_epoch_never_outranks_whatever_its_step(e1: int, e2: int, s1: int, s2: int) -> None:
    if e1 == e2:
        return
    low, high = sorted((e1, e2))
    a = encode_name(low, max(s1, s2), "exec/old/x")
    b = encode_name(high, min(s1, s2), "exec/new/x")
    result = latest([a, b])
    assert result is not None
    assert result.epoch == high


_PREFIXES = st.sampled_from(
    [
        GOOD[:42],
        encode_name(epoch(0, 2, 0), 9, "x")[:42],
        "0" * 20 + "-" + "0" * 20 + "-",
        "0" * 19 + "-" + "0" * 20 + "-",
        "0" * 20 + "-" + "0" * 19 + "\u0661-",
        "",
        "\n",
        ".",
    ]
)
_ENTRIES = st.one_of(
    st.builds(encode_name, epochs, steps, st.just("exec/a/x")),
    st.builds(lambda p, t: p + t, _PREFIXES, st.text(max_size=12)),
    st.builds(lambda p, t: t + "\n" + p + "MV4G", _PREFIXES, st.text(max_size=4)),
    st.text(max_size=50),
    st.sampled_from(["\udcff", GOOD + "\udcff", "notes.txt", "-", GOOD[:42] + "ZZ"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ENTRIES, max_size=30))
def test_latest_parses_exactly_the_names_that_could_win(entries: list[str]) -> None:
    # The rule, name by name: the first name (in listing order) whose epoch and step can't be
    # read is refused; otherwise the greatest name is parsed, and refused if it doesn't parse.
    unreadable = [e for e in entries if not _readable(e)]
    if not entries:
        assert latest(entries) is None
    elif unreadable:
        _same_refusal(entries, unreadable[0])
    else:
        try:
            expected = parse_name(max(entries))
        except MalformedName:
            _same_refusal(entries, max(entries))
        else:
            assert latest(entries) == expected
            assert latest(reversed(entries)) == expected  # any iterable, any order


def test_a_name_that_cant_be_read_is_found_past_the_first_thousand() -> None:
    good = [encode_name(epoch(0, 1, 0), s, f"exec/a/{s}") for s in range(3000)]
    assert latest(good) == parse_name(good[-1])
    for bad in ("0" * 19 + "-" + GOOD[20:], ".tmp", "x\n" + GOOD):
        for at in (0, 1023, 1024, 2500, 3000):
            _same_refusal([*good[:at], bad, *good[at:]], bad)
