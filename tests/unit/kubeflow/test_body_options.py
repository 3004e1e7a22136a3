"""TrainJob options a Kubeflow user expects (issue 12): CPU and memory requests/limits,
tolerations, a node selector and a PVC for the checkpoint root, checked at submission like the
other options. The body is checked here against the v2.3.0 CRD with what kube-apiserver 1.20
can't check (CEL rules, strict unknown fields); test_kubeflow_real_options.py creates it on the
real server."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch_backends.kubeflow.body import (
    InvalidLaunch,
    check_options,
    namespace_of,
    trainjob_body,
)
from dispatch_backends.kubeflow.settings import OPTIONS, KubeflowSettings
from tests.unit.kubeflow.test_body import admitted, launch

KUEUE = KubeflowSettings(namespaces=("team-a",), queue="lq")
ALL = {
    "gpus": "1",
    "cpu": "4",
    "memory": "16Gi",
    "cpu_limit": "8",
    "memory_limit": "32Gi",
    "node_selector": "pool=a100,topology.kubernetes.io/zone=eu-1a",
    "tolerations": "nvidia.com/gpu:NoSchedule,dedicated=training:NoExecute,spot",
    "checkpoint_pvc": "team-a-ckpt",
    "checkpoint_mount": "/ckpt",
}


def _pod_spec(body: dict[str, Any]) -> dict[str, Any]:
    (patch,) = body["spec"]["runtimePatches"]
    (rj,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rj["name"] == "node"
    spec: dict[str, Any] = rj["template"]["spec"]["template"]["spec"]
    return spec


def test_every_option_lands_where_the_trainer_reads_it_and_the_crd_admits_it() -> None:
    body = trainjob_body(launch(options=ALL, checkpoint="/ckpt/{job}"), KUEUE, "0a1b2c3d")
    assert body["spec"]["trainer"]["resourcesPerNode"] == {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "32Gi"},
    }
    pod = _pod_spec(body)
    assert pod["nodeSelector"] == {"pool": "a100", "topology.kubernetes.io/zone": "eu-1a"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoExecute"},
        {"key": "spot", "operator": "Exists"},
    ]
    assert pod["volumes"] == [
        {"name": "dispatch-checkpoints", "persistentVolumeClaim": {"claimName": "team-a-ckpt"}}
    ]
    assert pod["containers"] == [
        {"name": "node", "volumeMounts": [{"name": "dispatch-checkpoints", "mountPath": "/ckpt"}]}
    ]
    obj = admitted(body)  # the v2.3.0 CRD's schema and CEL rules, unknown fields refused
    assert obj["spec"]["runtimePatches"] == body["spec"]["runtimePatches"]
    assert obj["spec"]["trainer"]["resourcesPerNode"] == body["spec"]["trainer"]["resourcesPerNode"]


def test_the_pvc_mounts_at_checkpoints_by_default_and_excluded_nodes_share_the_patch() -> None:
    step = launch(options={"checkpoint_pvc": "ckpt"})
    step = type(step)(
        **{**{f: getattr(step, f) for f in step.__struct_fields__}, "exclude_nodes": ("n1",)}
    )
    pod = _pod_spec(trainjob_body(step, KUEUE, "00000000"))
    assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == "/checkpoints"
    assert pod["affinity"]["nodeAffinity"]
    admitted(trainjob_body(step, KUEUE, "00000000"))


def test_without_the_options_nothing_changes() -> None:
    body = trainjob_body(launch(), KUEUE, "00000000")
    assert "runtimePatches" not in body["spec"]
    assert "resourcesPerNode" not in body["spec"]["trainer"]


def test_the_options_are_listed_as_read() -> None:
    assert set(ALL) <= OPTIONS


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"cpu": "-1"}, "positive Kubernetes quantity"),
        ({"cpu": "0"}, "positive Kubernetes quantity"),
        ({"memory": "16GB"}, "option memory='16GB'"),
        ({"memory_limit": "lots"}, "option memory_limit='lots'"),
        ({"cpu_limit": ""}, "option cpu_limit=''"),
        ({"node_selector": "pool"}, "'pool' is not label=value"),
        ({"node_selector": "bad key=x"}, "is not label=value"),
        ({"tolerations": "gpu:Sometimes"}, "effect among NoSchedule"),
        ({"tolerations": "=x:NoSchedule"}, "is not key"),
        ({"checkpoint_pvc": "Team_A"}, "not a PersistentVolumeClaim name"),
        ({"checkpoint_pvc": "ckpt", "checkpoint_mount": "ckpt"}, "an absolute directory"),
        ({"checkpoint_pvc": "ckpt", "checkpoint_mount": "/"}, "an absolute directory"),
        ({"checkpoint_mount": "/ckpt"}, "needs checkpoint_pvc"),
    ],
)
def test_bad_values_are_refused_at_submission_and_at_launch_naming_the_option(
    options: dict[str, str], words: str
) -> None:
    step = launch(options=options)

    def build() -> None:
        namespace_of(step, KUEUE)
        trainjob_body(step, KUEUE, "00000000")

    with pytest.raises(InvalidLaunch, match=words):
        build()
    with pytest.raises(InvalidLaunch, match=words) as info:
        check_options(options, KUEUE)
    expected = "checkpoint_mount" if "checkpoint_mount" in options else next(iter(options))
    assert info.value.option == expected
