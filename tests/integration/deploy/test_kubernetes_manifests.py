"""deploy/kubernetes on a real kube-apiserver 1.20.2 (issue 12).

* Every manifest is created on the server: its validation of Deployments, StatefulSets,
  Services, ConfigMaps, Secrets and RBAC objects accepts it, and nothing we wrote is silently
  dropped (1.20 prunes unknown fields of built-in kinds without a word, so each document must
  come back with every field it sent).
* The RBAC both ways, impersonating ``system:serviceaccount:dispatch-system:dispatch``: each
  operation the Kubeflow backend performs is allowed (and the contract and scenario suites
  run the backend with that account's own token), a sample of others is forbidden.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.servers.kube import KubeApiServer
from tests.servers.pytest_kube_real import DEPLOY_DIR, SA_NAME, SA_NAMESPACE, manifest_docs

pytestmark = pytest.mark.integration

SA_USER = f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"
SA_GROUPS = (
    "system:serviceaccounts",
    f"system:serviceaccounts:{SA_NAMESPACE}",
    "system:authenticated",
)
TRAINING_NS = "team-a"

# (verb, group, resource[/subresource], namespace or "" for cluster-scoped): what
# libs/dispatch_backends/kubeflow/backend.py calls, and nothing more.
BACKEND_OPERATIONS = [
    ("create", "trainer.kubeflow.org", "trainjobs", TRAINING_NS),
    ("get", "trainer.kubeflow.org", "trainjobs", TRAINING_NS),
    ("list", "trainer.kubeflow.org", "trainjobs", TRAINING_NS),
    ("patch", "trainer.kubeflow.org", "trainjobs", TRAINING_NS),
    ("delete", "trainer.kubeflow.org", "trainjobs", TRAINING_NS),
    ("list", "jobset.x-k8s.io", "jobsets", TRAINING_NS),
    ("watch", "jobset.x-k8s.io", "jobsets", TRAINING_NS),
    ("list", "batch", "jobs", TRAINING_NS),
    ("watch", "batch", "jobs", TRAINING_NS),
    ("list", "kueue.x-k8s.io", "workloads", TRAINING_NS),
    ("watch", "kueue.x-k8s.io", "workloads", TRAINING_NS),
    ("patch", "kueue.x-k8s.io", "workloads", TRAINING_NS),
    ("list", "", "pods", TRAINING_NS),
    ("watch", "", "pods", TRAINING_NS),
    ("delete", "", "pods", TRAINING_NS),
    ("get", "", "pods/log", TRAINING_NS),
    ("list", "", "nodes", ""),
    ("watch", "", "nodes", ""),
]
NOT_NEEDED = [
    ("delete", "", "namespaces", ""),
    ("create", "", "namespaces", ""),
    ("get", "", "secrets", "kube-system"),
    ("list", "", "secrets", "default"),
    ("get", "", "secrets", SA_NAMESPACE),
    ("patch", "", "nodes", ""),
    ("update", "", "nodes", ""),
    ("delete", "", "nodes", ""),
    ("create", "", "pods", TRAINING_NS),
    ("update", "trainer.kubeflow.org", "trainjobs", TRAINING_NS),
    ("deletecollection", "trainer.kubeflow.org", "trainjobs", TRAINING_NS),
    ("create", "trainer.kubeflow.org", "trainjobs", "default"),
    ("list", "", "pods", "default"),
    ("get", "", "pods/log", "default"),
    ("create", "", "pods/exec", TRAINING_NS),
    ("create", "rbac.authorization.k8s.io", "rolebindings", TRAINING_NS),
    ("update", "jobset.x-k8s.io", "jobsets", TRAINING_NS),
]


def _missing(sent: Any, got: Any, path: str = "") -> list[str]:
    """Paths of what ``sent`` has and ``got`` lacks or holds differently."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [path or "/"]
        out: list[str] = []
        for key, value in sent.items():
            if key not in got:
                out.append(f"{path}/{key}")
            else:
                out.extend(_missing(value, got[key], f"{path}/{key}"))
        return out
    if isinstance(sent, list):
        if not isinstance(got, list) or len(sent) != len(got):
            return [path]
        return [
            m
            for i, (a, b) in enumerate(zip(sent, got, strict=True))
            for m in _missing(a, b, f"{path}/{i}")
        ]
    return [] if sent == got or str(sent) == str(got) else [f"{path}: {sent!r} != {got!r}"]


def _can(
    lab: KubeApiServer, verb: str, group: str, resource: str, namespace: str
) -> tuple[bool, str]:
    resource, _, subresource = resource.partition("/")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": SA_USER,
            "groups": list(SA_GROUPS),
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": resource,
                **({"subresource": subresource} if subresource else {}),
                **({"namespace": namespace} if namespace else {}),
            },
        },
    }
    status, answer = lab.request(
        "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review
    )
    assert status == 201, answer
    return bool(answer["status"].get("allowed")), str(answer["status"].get("reason", ""))


def test_every_manifest_is_accepted_by_the_server_and_nothing_is_dropped(
    kube_lab: KubeApiServer, kube_dispatch_token: str
) -> None:
    docs = manifest_docs()
    kinds = {d["kind"] for d in docs}
    assert {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "RoleBinding",
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "StatefulSet",
    } <= kinds
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == {
        "dispatch-observer",
        "dispatch-supervisor",
        "dispatch-notifier",
        "dispatch-api",
    }
    assert deployments["dispatch-supervisor"]["spec"]["replicas"] == 2
    nats = next(d for d in docs if d["kind"] == "StatefulSet")
    assert nats["spec"]["replicas"] == 3
    created = 0
    for doc in docs:
        status, answer = kube_lab.create(doc)
        what = f"{doc['kind']} {doc['metadata']['name']}"
        if status == 409 and doc["kind"] in (
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "RoleBinding",
        ):
            continue  # made by the session's kube_dispatch_token fixture from the same files
        assert status == 201, f"{what} refused: {status} {answer.get('message')}"
        created += 1
        sent = {k: v for k, v in doc.items() if k != "stringData"}  # Secret: write-only
        missing = _missing(sent, answer)
        assert not missing, f"{what}: the server dropped or changed {missing}"
    assert created >= 10
    assert (DEPLOY_DIR / "Dockerfile").is_file()
    assert (DEPLOY_DIR / "README.md").is_file()


def test_a_broken_manifest_is_refused_so_the_check_above_can_fail(kube_lab: KubeApiServer) -> None:
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "broken", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "c"}}, "spec": {"containers": []}},
        },
    }
    status, answer = kube_lab.create(bad)
    assert status == 422, answer
    typo = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "typo", "namespace": "default"},
        "dta": {"k": "v"},
    }
    status, answer = kube_lab.create(typo)
    assert status == 201
    assert _missing(typo, answer) == ["/dta"]  # what the subset check catches


@pytest.mark.parametrize(("verb", "group", "resource", "namespace"), BACKEND_OPERATIONS)
def test_the_service_account_may_do_what_the_backend_does(
    kube_lab: KubeApiServer,
    kube_dispatch_token: str,
    verb: str,
    group: str,
    resource: str,
    namespace: str,
) -> None:
    allowed, reason = _can(kube_lab, verb, group, resource, namespace)
    assert allowed, (
        f"{SA_USER} may not {verb} {resource}.{group} in {namespace or 'cluster'}: {reason}"
    )


@pytest.mark.parametrize(("verb", "group", "resource", "namespace"), NOT_NEEDED)
def test_the_service_account_may_do_nothing_else(
    kube_lab: KubeApiServer,
    kube_dispatch_token: str,
    verb: str,
    group: str,
    resource: str,
    namespace: str,
) -> None:
    allowed, _ = _can(kube_lab, verb, group, resource, namespace)
    assert not allowed, f"{SA_USER} may {verb} {resource}.{group} in {namespace or 'cluster'}"


def test_forbidden_requests_are_refused_for_real_as_the_service_account(
    kube_lab: KubeApiServer, kube_dispatch_token: str
) -> None:
    """The same refusals on real requests, both impersonated (``kubectl --as``) and with the
    account's own token."""
    kube_lab.ensure_namespace("victim")
    requests = [
        ("DELETE", "/api/v1/namespaces/victim", None),
        ("GET", "/api/v1/namespaces/kube-system/secrets", None),
        ("GET", f"/api/v1/namespaces/{SA_NAMESPACE}/secrets", None),
        ("PATCH", "/api/v1/nodes/any-node", {"metadata": {"labels": {"x": "y"}}}),
        ("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}),
    ]
    for method, path, body in requests:
        ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
        for how in ("impersonated", "token"):
            kwargs: dict[str, Any] = (
                {"impersonate": SA_USER, "groups": SA_GROUPS}
                if how == "impersonated"
                else {"token": kube_dispatch_token}
            )
            status, answer = kube_lab.request(method, path, body, content_type=ctype, **kwargs)
            assert status == 403, f"{how} {method} {path}: {status} {answer}"
            assert answer["reason"] == "Forbidden"
            assert SA_USER in answer["message"]
    # ... and an allowed one passes, with the token
    status, answer = kube_lab.request(
        "GET",
        f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{TRAINING_NS}/trainjobs",
        token=kube_dispatch_token,
    )
    assert status == 200, answer
