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
    permissions,
    render_server_config,
    service_identities,
    users,
)

LAYOUTS = [Layout(), Layout(namespace="t1", api_prefix="$JS.hub.API")]
FOLLOWS = {
    Role.API: {StreamKind.STATUS},
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
