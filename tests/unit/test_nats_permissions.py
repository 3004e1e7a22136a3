"""The generated NATS permissions, checked subject by subject without a server: no identity
may create, update or delete a consumer another identity owns (issue 10). The same verdicts
from a real nats-server: tests/integration/nats/test_nats_consumer_ownership.py."""

from __future__ import annotations

import pytest

from dispatch_nats import Layout, StreamKind
from dispatch_nats.errors import InvalidName
from dispatch_nats.permissions import (
    Identity,
    Role,
    durables,
    inbox_prefix,
    permissions,
    render_server_config,
    service_identities,
    users,
)

LAYOUTS = [Layout(), Layout(namespace="t1", api_prefix="$JS.hub.API")]
FOLLOWS = {
    Role.API: {StreamKind.STATUS, StreamKind.RECORD},  # the jobs index follows both
    Role.SUPERVISOR: {StreamKind.STATUS},
    Role.NOTIFIER: set(),
    Role.OBSERVER: set(),
    Role.READER: {StreamKind.RECORD, StreamKind.DISCOVERY, StreamKind.STATUS},
}


def _touching(layout: Layout, stream: str, name: str) -> list[str]:
    """Every subject that creates, updates or deletes consumer ``name`` of ``stream``."""
    api = layout.api_prefix
    return [
        f"{api}.CONSUMER.CREATE.{stream}.{name}",
        f"{api}.CONSUMER.CREATE.{stream}.{name}.{layout.root}.>",
        f"{api}.CONSUMER.CREATE.{stream}.{name}.x.y",
        f"{api}.CONSUMER.DURABLE.CREATE.{stream}.{name}",
        f"{api}.CONSUMER.DELETE.{stream}.{name}",
    ]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["contract", "namespaced"])
@pytest.mark.parametrize(("sup", "notifier"), [("supervisor", "notifier"), ("sv2", "nt2")])
def test_no_identity_may_touch_a_consumer_it_does_not_own(
    layout: Layout, sup: str, notifier: str
) -> None:
    owned = durables(layout, supervisor_durable=sup, notifier_durable=notifier)
    assert set(owned.values()) == {Role.SUPERVISOR, Role.NOTIFIER}
    for identity in service_identities(["local", "gpu"]):
        perms = permissions(layout, identity, supervisor_durable=sup, notifier_durable=notifier)
        for kind in StreamKind:
            stream = layout.stream(kind)
            # the nameless create, whose body may name any consumer: nobody
            assert not perms.publish_allowed(f"{layout.api_prefix}.CONSUMER.CREATE.{stream}")
            # an ordered feed's freshly named consumer: exactly the streams it follows
            fresh = f"{layout.api_prefix}.CONSUMER.CREATE.{stream}.ordered-0a1b"
            follows = kind in FOLLOWS[identity.role]
            assert perms.publish_allowed(fresh) is follows, (identity, kind)
            assert perms.publish_allowed(f"{fresh}.{layout.root}.>") is follows
        for (stream, name), owner in owned.items():
            subjects = _touching(layout, stream, name)
            if owner is identity.role:  # its own: create and update, never delete
                assert all(perms.publish_allowed(s) for s in subjects[:3]), identity
                assert not any(perms.publish_allowed(s) for s in subjects[3:]), identity
            else:
                allowed = [s for s in subjects if perms.publish_allowed(s)]
                assert allowed == [], (identity, allowed)


def test_the_deny_list_is_in_the_server_configuration() -> None:
    layout = Layout()
    keys = {Identity(Role.READER): "U" + "A" * 55}
    config = render_server_config(users(layout, keys), store_dir="/tmp/x", server_name="n")
    assert "deny: [" in config
    assert '"$JS.API.CONSUMER.CREATE.DISPATCH_DISCOVERY.supervisor-discovery"' in config
    assert '"$JS.API.CONSUMER.CREATE.DISPATCH_RECORD"' in config


@pytest.mark.parametrize(
    ("sup", "notifier"),
    [("supervisor", "supervisor-record"), ("a.b", "notifier"), ("ordered-x", "notifier")],
)
def test_durable_names_that_would_blur_ownership_are_refused(sup: str, notifier: str) -> None:
    with pytest.raises(InvalidName):
        durables(Layout(), supervisor_durable=sup, notifier_durable=notifier)


@pytest.mark.parametrize("layout", LAYOUTS, ids=["contract", "namespaced"])
def test_only_the_api_asks_for_output_and_only_that_cluster_s_observer_answers(
    layout: Layout,
) -> None:
    """``dispatch logs``: the API requests on ``dispatch.logs.<cluster>``; the observer of
    that cluster alone subscribes there, and answers through ``allow_responses`` (one reply
    to a request's reply subject), never by publishing into an inbox."""
    clusters = ["local", "gpu"]
    for identity in service_identities(clusters):
        perms = permissions(layout, identity)
        for cluster in clusters:
            subject = layout.logs_subject(cluster)
            assert perms.publish_allowed(subject) is (identity.role is Role.API), identity
            subscribes = any(_matches_pattern(p, subject) for p in perms.subscribe)
            mine = identity.role is Role.OBSERVER and identity.cluster == cluster
            assert subscribes is mine, (identity, cluster)
        assert perms.allow_responses is (identity.role is Role.OBSERVER), identity
        assert not perms.publish_allowed(f"{inbox_prefix(Identity(Role.API), layout)}.x")
        assert layout.logs_filter not in perms.subscribe
    keys = {Identity(Role.OBSERVER, "local"): "U" + "A" * 55, Identity(Role.API): "U" + "B" * 55}
    config = render_server_config(users(layout, keys), store_dir="/tmp/x", server_name="n")
    assert config.count("allow_responses") == 1  # the observer's only


def _matches_pattern(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)
