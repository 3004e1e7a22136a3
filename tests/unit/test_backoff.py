"""The project's one backoff (dispatch_core.backoff) and the services' server-list parsing."""

from __future__ import annotations

import itertools

from dispatch_core.backoff import Backoff
from services.common.lifecycle import server_list


def test_delays_double_up_to_the_cap_without_jitter() -> None:
    backoff = Backoff(base_s=0.1, max_s=1.0, jitter=0.5)
    assert list(itertools.islice(backoff.delays(), 6)) == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_delays_take_jitter_from_the_given_source() -> None:
    backoff = Backoff(base_s=1.0, max_s=8.0, jitter=0.5)
    assert list(itertools.islice(backoff.delays(lambda: 1.0), 3)) == [0.5, 1.0, 2.0]


def test_server_list_splits_comma_lists_and_keeps_order() -> None:
    assert server_list("nats://a:1, nats://b:2,,nats://c:3") == [
        "nats://a:1",
        "nats://b:2",
        "nats://c:3",
    ]
    assert server_list(("nats://a:1,nats://b:2", "nats://c:3")) == [
        "nats://a:1",
        "nats://b:2",
        "nats://c:3",
    ]
