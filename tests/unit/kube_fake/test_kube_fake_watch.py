"""Watches on the fake API server, seen through the real client's ``kubernetes.watch.Watch``.

These pin the three behaviours of ``Watch.stream`` (kubernetes 37) that the facts file lists:
one retry after a 410 ``ERROR`` event and then ``ApiException(410)``; no reconnect when
``timeout_seconds`` is passed; no reconnect once no event carried a ``resourceVersion``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch

from tests.fakes.kube_apiserver import TRAINJOBS, FakeKubeApiServer
from tests.fakes.kube_controller import train_job_body

G, V, P = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
NS = "team-a"
# kubernetes.watch is untyped; hold it as Any so strict mypy accepts the calls.
Watch: Any = watch.Watch


@pytest.fixture
def custom(kube_api_client: Any) -> Any:
    return client.CustomObjectsApi(kube_api_client)


def _create(server: FakeKubeApiServer, name: str, **kwargs: Any) -> dict[str, Any]:
    obj, _ = server.store.create(TRAINJOBS, NS, train_job_body(name, **kwargs))
    return obj


def _list_rv(custom: Any) -> str:
    rv: str = custom.list_namespaced_custom_object(G, V, NS, P)["metadata"]["resourceVersion"]
    return rv


def _watch(custom: Any, **kwargs: Any) -> Any:
    return Watch().stream(custom.list_namespaced_custom_object, G, V, NS, P, **kwargs)


def test_watch_from_a_list_sees_later_changes_then_closes_at_timeout(
    custom: Any, kube_server: FakeKubeApiServer
) -> None:
    _create(kube_server, "before")
    rv = _list_rv(custom)
    _create(kube_server, "after")
    kube_server.store.patch(TRAINJOBS, NS, "after", "merge", {"spec": {"suspend": True}})
    kube_server.store.delete(TRAINJOBS, NS, "before")
    started = time.monotonic()
    events = [
        (e["type"], e["object"]["metadata"]["name"])
        for e in _watch(custom, resource_version=rv, timeout_seconds=1)
    ]
    assert events == [("ADDED", "after"), ("MODIFIED", "after"), ("DELETED", "before")]
    assert 0.9 <= time.monotonic() - started < 5  # no reconnect when timeout_seconds is passed


def test_watch_without_resource_version_starts_with_the_current_objects(
    custom: Any, kube_server: FakeKubeApiServer
) -> None:
    _create(kube_server, "a")
    _create(kube_server, "b")
    events = [
        (e["type"], e["object"]["metadata"]["name"]) for e in _watch(custom, timeout_seconds=1)
    ]
    assert events == [("ADDED", "a"), ("ADDED", "b")]


def test_events_carry_increasing_resource_versions(
    custom: Any, kube_server: FakeKubeApiServer
) -> None:
    rv = _list_rv(custom)
    for n in range(3):
        _create(kube_server, f"tj-{n}")
    rvs = [
        int(e["object"]["metadata"]["resourceVersion"])
        for e in _watch(custom, resource_version=rv, timeout_seconds=1)
    ]
    assert rvs == sorted(rvs)
    assert len(rvs) == 3
    assert rvs[0] > int(rv)


def test_bookmarks_every_interval_and_before_the_timeout(
    custom: Any, kube_server: FakeKubeApiServer
) -> None:
    kube_server.bookmark_interval = 0.4
    rv = _list_rv(custom)
    _create(kube_server, "a")
    events = list(
        _watch(custom, resource_version=rv, timeout_seconds=1, allow_watch_bookmarks=True)
    )
    kinds = [e["type"] for e in events]
    assert kinds[0] == "ADDED"
    assert kinds.count("BOOKMARK") >= 2
    bookmark = events[-1]
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["raw_object"]["kind"] == "TrainJob"
    assert int(bookmark["raw_object"]["metadata"]["resourceVersion"]) >= int(
        events[0]["object"]["metadata"]["resourceVersion"]
    )


def test_no_bookmarks_unless_asked(custom: Any, kube_server: FakeKubeApiServer) -> None:
    kube_server.bookmark_interval = 0.2
    assert [
        e["type"] for e in _watch(custom, resource_version=_list_rv(custom), timeout_seconds=1)
    ] == []


def test_label_selector_on_a_watch_turns_transitions_into_added_and_deleted(
    custom: Any, kube_server: FakeKubeApiServer
) -> None:
    rv = _list_rv(custom)
    _create(kube_server, "tj-1", labels={"dispatch": "yes"})
    _create(kube_server, "other")
    kube_server.store.patch(
        TRAINJOBS, NS, "tj-1", "merge", {"metadata": {"labels": {"dispatch": "no"}}}
    )
    kube_server.store.patch(
        TRAINJOBS, NS, "other", "merge", {"metadata": {"labels": {"dispatch": "yes"}}}
    )
    events = [
        (e["type"], e["object"]["metadata"]["name"])
        for e in _watch(
            custom, resource_version=rv, timeout_seconds=1, label_selector="dispatch=yes"
        )
    ]
    assert events == [("ADDED", "tj-1"), ("DELETED", "tj-1"), ("ADDED", "other")]


def test_expired_resource_version_with_timeout_raises_410_at_once(
    custom: Any, kube_server: FakeKubeApiServer
) -> None:
    rv = _list_rv(custom)
    _create(kube_server, "a")
    kube_server.expire_watch_cache()
    with pytest.raises(client.ApiException) as info:
        list(_watch(custom, resource_version=rv, timeout_seconds=5))
    assert info.value.status == 410
    assert "Expired" in info.value.reason
    watches = [r for r in kube_server.requests if r.query.get("watch") == "true"]
    assert len(watches) == 1  # timeout_seconds disables the client's retry


def test_expired_resource_version_is_retried_once_then_raises(
    custom: Any, kube_server: FakeKubeApiServer
) -> None:
    rv = _list_rv(custom)
    _create(kube_server, "a")
    kube_server.expire_watch_cache()
    with pytest.raises(client.ApiException) as info:
        list(_watch(custom, resource_version=rv))
    assert info.value.status == 410
    watches = [r for r in kube_server.requests if r.query.get("watch") == "true"]
    assert [w.query["resourceVersion"] for w in watches] == [rv, rv]


def test_bounded_history_expires_old_resource_versions(custom: Any) -> None:
    with FakeKubeApiServer(watch_cache_size=3) as server:
        api: Any = server.api_client()
        try:
            custom = client.CustomObjectsApi(api)
            rv = _list_rv(custom)
            for n in range(5):
                _create(server, f"tj-{n}")
            with pytest.raises(client.ApiException) as info:
                list(_watch(custom, resource_version=rv, timeout_seconds=1))
            assert info.value.status == 410
            recent = server.store.get(TRAINJOBS, NS, "tj-2")["metadata"]["resourceVersion"]
            names = [
                e["object"]["metadata"]["name"]
                for e in _watch(custom, resource_version=recent, timeout_seconds=1)
            ]
            assert names == ["tj-3", "tj-4"]
        finally:
            api.close()


def test_relist_after_410_then_watch_again(custom: Any, kube_server: FakeKubeApiServer) -> None:
    rv = _list_rv(custom)
    _create(kube_server, "a")
    kube_server.expire_watch_cache()
    with pytest.raises(client.ApiException):
        list(_watch(custom, resource_version=rv, timeout_seconds=1))
    listing = custom.list_namespaced_custom_object(G, V, NS, P)
    assert [i["metadata"]["name"] for i in listing["items"]] == ["a"]
    _create(kube_server, "b")
    names = [
        e["object"]["metadata"]["name"]
        for e in _watch(
            custom, resource_version=listing["metadata"]["resourceVersion"], timeout_seconds=1
        )
    ]
    assert names == ["b"]


def test_clean_drop_mid_stream_reconnects_from_the_last_resource_version(
    custom: Any, kube_server: FakeKubeApiServer
) -> None:
    """Without timeout_seconds the client reconnects after a stream ends, from the last RV."""
    rv = _list_rv(custom)
    kube_server.faults.drop_next_watch(after_events=2)
    for n in range(4):
        _create(kube_server, f"tj-{n}")
    seen: list[str] = []
    w = Watch()
    for event in w.stream(custom.list_namespaced_custom_object, G, V, NS, P, resource_version=rv):
        seen.append(event["object"]["metadata"]["name"])
        if len(seen) == 4:
            w.stop()
    assert seen == ["tj-0", "tj-1", "tj-2", "tj-3"]
    watches = [r for r in kube_server.requests if r.query.get("watch") == "true"]
    assert len(watches) == 2
    assert int(watches[1].query["resourceVersion"]) > int(rv)


def test_abrupt_drop_mid_stream_surfaces_as_a_protocol_error(
    custom: Any, kube_server: FakeKubeApiServer
) -> None:
    rv = _list_rv(custom)
    kube_server.faults.drop_next_watch(after_events=1, abrupt=True)
    _create(kube_server, "a")
    _create(kube_server, "b")
    seen: list[str] = []

    def consume() -> None:
        for event in _watch(custom, resource_version=rv, timeout_seconds=5):
            seen.append(event["object"]["metadata"]["name"])

    with pytest.raises(urllib3.exceptions.ProtocolError):
        consume()
    assert seen == ["a"]


def test_drop_watches_now_from_the_test_thread(custom: Any, kube_server: FakeKubeApiServer) -> None:
    rv = _list_rv(custom)
    seen: list[str] = []

    def consume() -> None:
        for event in _watch(custom, resource_version=rv, timeout_seconds=30):
            seen.append(event["type"])

    thread = threading.Thread(target=consume)
    thread.start()
    kube_server.wait_for_watches(1, TRAINJOBS)
    _create(kube_server, "a")
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kube_server.drop_watches() == 1
    thread.join(5)
    assert not thread.is_alive()  # timeout_seconds given: the client does not reconnect
    assert seen == ["ADDED"]


def test_no_reconnect_when_no_event_carried_a_resource_version(
    custom: Any, kube_server: FakeKubeApiServer
) -> None:
    """A stream that ends before any event leaves the client without a RV: it stops."""
    kube_server.faults.drop_next_watch(after_events=0)
    assert list(Watch().stream(custom.list_namespaced_custom_object, G, V, NS, P)) == []
    assert len([r for r in kube_server.requests if r.query.get("watch") == "true"]) == 1


def test_injected_500_on_the_watch_request(custom: Any, kube_server: FakeKubeApiServer) -> None:
    kube_server.faults.fail_next(1, status=500, watch=True)
    with pytest.raises(client.ApiException) as info:
        list(_watch(custom, timeout_seconds=1))
    assert info.value.status == 500


def test_core_watch_of_pods_deserializes_typed_objects(
    kube_api_client: Any, kube_server: FakeKubeApiServer
) -> None:
    core: Any = client.CoreV1Api(kube_api_client)
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(
        NS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "m", "image": "x"}]},
        },
    )
    events = list(
        Watch().stream(core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1)
    )
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "p")]
    assert isinstance(events[0]["object"], client.V1Pod)
