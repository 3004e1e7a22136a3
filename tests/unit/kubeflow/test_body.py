"""The TrainJob a launch makes: admitted by the unchanged v2.3.0 CRD schema, with what
kube-apiserver 1.20 can't check (CEL rules, unknown fields refused under ``Strict``;
``tests/fakes/kube_schema.py``, no server), with dispatch's labels, annotations, gate and
environment."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dispatch_backends.kubeflow.body import (
    InvalidLaunch,
    check_options,
    namespace_of,
    trainjob_body,
)
from dispatch_backends.kubeflow.settings import GateMode, KubeflowSettings
from dispatch_core.epoch import epoch
from dispatch_core.state import JobSpec
from tests.contract.backend_contract import make_launch
from tests.fakes.kube_schema import TRAINJOB_SCHEMA
from tests.unit.kubeflow.records import container_env

KUEUE = KubeflowSettings(namespaces=("team-a", "team-b"), queue="lq")
SUSPEND = KubeflowSettings(gate=GateMode.SUSPEND)


def launch(job: str = "j1", **spec: Any) -> Any:
    kw: dict[str, Any] = {"cluster": "c", "command": ("python", "train.py")}
    kw.update(spec)
    return make_launch(job, JobSpec(**kw), generation=2, submission=3, attempt=4)


def admitted(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` pruned, defaulted and validated by the v2.3.0 CRD, unknown fields refused
    (``StrictDecodingError``); asserts it is valid and returns the object as stored."""
    obj, warnings, errors = TRAINJOB_SCHEMA.admit(body, None, field_validation="Strict")
    assert (warnings, errors) == ([], [])
    return obj


def test_the_body_is_admitted_by_the_v230_crd_with_the_gate_closed() -> None:
    body = trainjob_body(
        launch(env={"LR": "0.1", "DISPATCH_EPOCH": "7"}, checkpoint="s3://b/j1"), KUEUE, "0a1b2c3d"
    )
    obj = admitted(body)
    meta = obj["metadata"]
    assert meta["name"] == "dj-j1-3-4"
    assert meta["labels"] == {
        "dispatch.dev/job": "j1",
        "dispatch.dev/submission": "3",
        "dispatch.dev/attempt": "4",
        "kueue.x-k8s.io/queue-name": "lq",
    }
    assert meta["annotations"] == {
        "dispatch.dev/name": "dj-j1",
        "dispatch.dev/generation": "2",
        "dispatch.dev/token": "0a1b2c3d",
        "kueue.x-k8s.io/admission-gated-by": "dispatch.dev/start-gate",
    }
    assert obj["spec"]["suspend"] is True
    assert obj["spec"]["trainer"]["command"] == ["python", "train.py"]
    assert "runtimePatches" not in obj["spec"]


def test_the_environment_as_the_kubelet_resolves_it() -> None:
    body = trainjob_body(
        launch(env={"LR": "0.1", "DISPATCH_EPOCH": "7"}, checkpoint="s3://b/j1"), KUEUE, "0a1b2c3d"
    )
    pod = {
        "metadata": {"labels": {"jobset.sigs.k8s.io/restart-attempt": "5"}},
        "spec": {"containers": [{"name": "node", "env": body["spec"]["trainer"]["env"]}]},
    }
    assert container_env(pod) == {
        "LR": "0.1",  # the job's own; its DISPATCH_EPOCH is overridden by dispatch's
        "DISPATCH_JOB": "j1",
        "DISPATCH_SUBMISSION": "3",
        "DISPATCH_GENERATION": "2",
        "DISPATCH_CHECKPOINT": "s3://b/j1",
        "DISPATCH_RESTART": "5",
        "DISPATCH_ATTEMPT": "dj-j1-3-4-0a1b2c3d-r5",
        "DISPATCH_EPOCH": str(epoch(2, 3, 0)),
    }


def test_suspend_mode_marks_dispatchs_gate() -> None:
    obj = admitted(trainjob_body(launch(), SUSPEND, "00000000"))
    assert obj["metadata"]["annotations"]["dispatch.dev/gate"] == "closed"
    assert "kueue.x-k8s.io/queue-name" not in obj["metadata"]["labels"]
    assert obj["spec"]["suspend"] is True


def test_options() -> None:
    options = {
        "namespace": "team-b",
        "queue": "big",
        "runtime": "deepspeed",
        "runtime_kind": "TrainingRuntime",
        "image": "ghcr.io/x/y:2",
        "nodes": "4",
        "procs_per_node": "8",
        "gpus": "8",
        "time": "1:00:00",
        "priority_class": "high",
        "partition": "ignored (a Slurm option)",
    }
    step = launch(options=options)
    assert namespace_of(step, KUEUE) == "team-b"
    obj = admitted(trainjob_body(step, KUEUE, "00000000"))
    assert obj["spec"]["runtimeRef"] == {
        "name": "deepspeed",
        "kind": "TrainingRuntime",
        "apiGroup": "trainer.kubeflow.org",
    }
    trainer = obj["spec"]["trainer"]
    assert (trainer["image"], trainer["numNodes"], trainer["numProcPerNode"]) == (
        "ghcr.io/x/y:2",
        4,
        8,
    )
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert obj["spec"]["activeDeadlineSeconds"] == 3600
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "big"
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"


def test_a_script_runs_with_sh() -> None:
    obj = admitted(trainjob_body(launch(command=(), script="echo hi"), KUEUE, "00000000"))
    assert obj["spec"]["trainer"]["command"] == ["/bin/sh", "-c", "echo hi"]


def test_excluded_nodes_become_a_runtime_patch() -> None:
    step = msgspec.structs.replace(launch(), exclude_nodes=("node-a",))
    obj = admitted(trainjob_body(step, KUEUE, "00000000"))
    (patch,) = obj["spec"]["runtimePatches"]
    assert patch["manager"] == "dispatch.dev/backend"
    (rj,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rj["name"] == "node"
    terms = rj["template"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-a"]}
            ]
        }
    ]


@pytest.mark.parametrize(
    ("settings", "options", "words"),
    [
        (KUEUE, {"namespace": "elsewhere"}, "not one of this cluster's"),
        (KubeflowSettings(), {}, "needs a Kueue LocalQueue"),
        (KUEUE, {"nodes": "0"}, "expected at least 1"),
        (KUEUE, {"gpus": "many"}, "expected an integer"),
        (KUEUE, {"time": "soon"}, "option time='soon'"),
    ],
)
def test_launches_that_cant_be_a_trainjob(
    settings: KubeflowSettings, options: dict[str, str], words: str
) -> None:
    step = launch(options=options)

    def build() -> None:
        namespace_of(step, settings)
        trainjob_body(step, settings, "00000000")

    with pytest.raises(InvalidLaunch, match=words):
        build()
    # The API's check at submission refuses the same, naming the option.
    with pytest.raises(InvalidLaunch, match=words) as info:
        check_options(options, settings)
    assert info.value.option == (next(iter(options)) if options else "queue")
