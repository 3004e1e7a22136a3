"""The naming scheme: ``dj-<job>-<N>-<a>``, cut and hashed to an RFC 1035 label of <= 63."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from dispatch_backends.kubeflow.names import MAX_NAME, read_number, trainjob_name
from dispatch_core.state import JOB_ID_PATTERN

RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
job_ids = st.from_regex(JOB_ID_PATTERN, fullmatch=True)


def test_a_short_id_keeps_the_readable_name() -> None:
    assert trainjob_name("train-llama", 2, 3) == "dj-train-llama-2-3"


def test_a_long_id_is_cut_and_hashed_to_fit() -> None:
    job = "a" * 40 + "-" + "b" * 22  # 63 characters, a '-' where the cut falls
    name = trainjob_name(job, 999_999, 12)
    assert len(name) <= MAX_NAME
    assert RFC1035.match(name), name
    assert name.startswith("dj-aaaa")
    assert name.endswith("-999999-12")
    assert "--" not in name


def test_ids_sharing_a_long_prefix_get_different_names() -> None:
    common = "x" * 60
    assert trainjob_name(common + "a", 1, 1) != trainjob_name(common + "b", 1, 1)


@given(job_ids, st.integers(1, 999_999), st.integers(1, 10_000))
def test_every_name_is_an_rfc1035_label_of_at_most_63(job: str, n: int, a: int) -> None:
    name = trainjob_name(job, n, a)
    assert len(name) <= MAX_NAME
    assert RFC1035.match(name), name
    assert name.endswith(f"-{n}-{a}")


def test_read_number() -> None:
    assert read_number({"k": "12"}, "k") == 12
    for bad in ("", "0", "01", "-1", "x", "1.0"):
        assert read_number({"k": bad}, "k") is None
    assert read_number(None, "k") is None
    assert read_number({"k": 3}, "k") is None
