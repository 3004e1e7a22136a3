"""The gate race on a real kube-apiserver 1.20.2 (issue 12): dispatch opens its gate with a
JSON patch whose ``test`` op guards the gates it read; when Kueue or an admin changes the
annotation between that read and the patch, the real server answers a bare ``422 Invalid``
with no details, and the backend must read again and retry, never fail the open nor overwrite
the other gate."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client as k8s

from dispatch_backends.kubeflow import GateMode, KubeflowBackend, KubeflowSettings
from dispatch_backends.kubeflow.names import ADMISSION_GATED_BY, ANNOTATION_GATE, TRAINER
from dispatch_backends.protocol import BackendError
from dispatch_core.state import JobSpec, ObjectRef
from tests.contract.backend_contract import make_launch, new_job_id
from tests.servers.kube import KubeApiServer

pytestmark = pytest.mark.integration

CLUSTER = "real"
MERGE = "application/merge-patch+json"


@pytest.fixture
async def admin(kube_lab: KubeApiServer) -> AsyncIterator[Any]:
    api = kube_lab.api_client()
    yield api
    api.close()


def _backend(api: Any, namespace: str, gate: GateMode) -> KubeflowBackend:
    settings = KubeflowSettings(
        namespaces=(namespace,),
        gate=gate,
        queue="lq" if gate is GateMode.KUEUE else "",
        watch_timeout_s=5.0,
    )
    return KubeflowBackend(CLUSTER, settings, api)


async def _started(backend: KubeflowBackend) -> ObjectRef:
    spec = JobSpec(cluster=CLUSTER, command=("python", "t.py"), options={"image": "i:1"})
    return await backend.start(make_launch(new_job_id(), spec))


def _read(api: Any, ref: ObjectRef) -> dict[str, Any]:
    namespace, name = ref.id.split("/")
    group, version, plural = TRAINER
    custom: Any = k8s.CustomObjectsApi(api)
    found: dict[str, Any] = custom.get_namespaced_custom_object(
        group, version, namespace, plural, name
    )
    return found


class _Interleaved:
    """Wraps the backend's ``patch_namespaced_custom_object``: before its first JSON patch,
    another writer (Kueue, an admin) changes the TrainJob through the API server."""

    def __init__(self, backend: KubeflowBackend, meanwhile: Any) -> None:
        self.real = backend._custom.patch_namespaced_custom_object
        self.meanwhile = meanwhile
        self.answers: list[int] = []
        backend._custom.patch_namespaced_custom_object = self  # type: ignore[method-assign]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_content_type") == "application/json-patch+json" and not self.answers:
            self.meanwhile()
        try:
            answer = self.real(*args, **kwargs)
        except k8s.ApiException as err:
            self.answers.append(err.status or 0)
            raise
        self.answers.append(200)
        return answer


async def test_a_gate_added_between_read_and_patch_is_kept_and_ours_opens(
    admin: Any, kube_ns: str
) -> None:
    backend = _backend(admin, kube_ns, GateMode.KUEUE)
    try:
        ref = await _started(backend)
        ours = _read(admin, ref)["metadata"]["annotations"][ADMISSION_GATED_BY]
        namespace, name = ref.id.split("/")
        group, version, plural = TRAINER

        def admin_adds_a_gate() -> None:
            k8s.CustomObjectsApi(admin).patch_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                name,
                {"metadata": {"annotations": {ADMISSION_GATED_BY: ours + ",ops.example/hold"}}},
                _content_type=MERGE,
            )

        patches = _Interleaved(backend, admin_adds_a_gate)
        await backend.open_gate(ref)
        # the real server refused the first patch with its bare 422, the second went through
        assert patches.answers == [422, 200]
        after = _read(admin, ref)["metadata"]["annotations"]
        assert after[ADMISSION_GATED_BY] == "ops.example/hold"
    finally:
        await backend.aclose()


async def test_the_bare_422_has_no_words_about_the_test_op(admin: Any, kube_ns: str) -> None:
    """What the fix is for: the real server's answer names neither the op nor the path."""
    backend = _backend(admin, kube_ns, GateMode.SUSPEND)
    try:
        ref = await _started(backend)
        namespace, name = ref.id.split("/")
        group, version, plural = TRAINER
        path = "/metadata/annotations/" + ANNOTATION_GATE.replace("/", "~1")
        with pytest.raises(k8s.ApiException) as caught:
            await asyncio.to_thread(
                k8s.CustomObjectsApi(admin).patch_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                name,
                [{"op": "test", "path": path, "value": "open"}],
                _content_type="application/json-patch+json",
            )
        assert caught.value.status == 422
        body = json.loads(caught.value.body or "{}")
        assert body["reason"] == "Invalid"
        assert "test" not in body["message"].lower()
    finally:
        await backend.aclose()


async def test_suspend_gate_opens_after_a_concurrent_annotation_change(
    admin: Any, kube_ns: str
) -> None:
    backend = _backend(admin, kube_ns, GateMode.SUSPEND)
    try:
        ref = await _started(backend)
        namespace, name = ref.id.split("/")
        group, version, plural = TRAINER

        def someone_rewrites_the_gate() -> None:
            # an operator's tool re-applies the object: the annotation is briefly
            # something else, then "closed" again, which the stale read can't know
            custom = k8s.CustomObjectsApi(admin)
            for value in ("reapplying", "closed"):
                custom.patch_namespaced_custom_object(
                    group,
                    version,
                    namespace,
                    plural,
                    name,
                    {"metadata": {"annotations": {ANNOTATION_GATE: value}}},
                    _content_type=MERGE,
                )

        _Interleaved(backend, someone_rewrites_the_gate)
        await backend.open_gate(ref)
        after = _read(admin, ref)
        assert after["metadata"]["annotations"][ANNOTATION_GATE] == "open"
        assert after["spec"].get("suspend") in (False, None)
    finally:
        await backend.aclose()


async def test_a_refusal_that_a_new_read_does_not_explain_is_not_retried(
    admin: Any, kube_ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _backend(admin, kube_ns, GateMode.KUEUE)
    try:
        ref = await _started(backend)
        calls: list[int] = []

        def never_matching(trainjob: Any, mode: GateMode, gate_name: str) -> list[Any]:
            calls.append(1)
            path = "/metadata/annotations/" + ADMISSION_GATED_BY.replace("/", "~1")
            return [{"op": "test", "path": path, "value": "not-what-is-there"}]

        monkeypatch.setattr("dispatch_backends.kubeflow.backend.open_patch", never_matching)
        with pytest.raises(BackendError, match="rejected our request") as caught:
            await backend.open_gate(ref)
        assert "kept changing" not in str(caught.value)
        assert len(calls) == 1  # read, patch refused, read again: same object, so it stops
    finally:
        await backend.aclose()


async def test_a_409_after_a_concurrent_write_is_read_again_and_retried(
    admin: Any, kube_ns: str
) -> None:
    """A 409 Conflict (the object changed under the request) is retried like the 422. The
    server answers a JSON patch without a resourceVersion with 422, not 409, so the 409 is
    the answer a proxy or an older server could give: the stand-in makes the concurrent
    write for real, then answers 409 for the first patch."""
    backend = _backend(admin, kube_ns, GateMode.KUEUE)
    try:
        ref = await _started(backend)
        namespace, name = ref.id.split("/")
        group, version, plural = TRAINER
        custom: Any = k8s.CustomObjectsApi(admin)
        real = backend._custom.patch_namespaced_custom_object
        answers: list[int] = []

        def conflict_once(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("_content_type") == "application/json-patch+json" and not answers:
                custom.patch_namespaced_custom_object(
                    group,
                    version,
                    namespace,
                    plural,
                    name,
                    {"metadata": {"labels": {"touched": "yes"}}},
                    _content_type=MERGE,
                )
                answers.append(409)
                raise k8s.ApiException(status=409, reason="Conflict")
            answer = real(*args, **kwargs)
            answers.append(200)
            return answer

        backend._custom.patch_namespaced_custom_object = conflict_once  # type: ignore[method-assign]
        await backend.open_gate(ref)
        assert answers == [409, 200]
        assert ADMISSION_GATED_BY not in (_read(admin, ref)["metadata"].get("annotations") or {})
    finally:
        await backend.aclose()
