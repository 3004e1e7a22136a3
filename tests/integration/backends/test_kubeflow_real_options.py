"""The TrainJob options on the real kube-apiserver 1.20.2: the backend (as the deploy/kubernetes
ServiceAccount) creates a TrainJob with every option, the server's structural validation of the
Trainer v2.3.0 CRD admits it and keeps every field (1.20 prunes unknown fields silently, so a
field the CRD does not have would vanish here)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch_backends.kubeflow import GateMode, KubeflowBackend, KubeflowSettings
from dispatch_backends.protocol import LaunchRefusedError
from dispatch_core.state import JobSpec
from tests.contract.backend_contract import make_launch, new_job_id
from tests.servers.kube import KubeApiServer
from tests.servers.kube_resources import TRAINJOBS
from tests.unit.kubeflow.test_body_options import ALL

pytestmark = pytest.mark.integration

NS = "team-a"  # the namespace deploy/kubernetes binds the ServiceAccount in


async def test_a_trainjob_with_every_option_is_admitted_and_kept_whole(
    kube_lab: KubeApiServer, kube_dispatch_token: str
) -> None:
    api = kube_lab.api_client(kube_dispatch_token)
    backend = KubeflowBackend(
        "real", KubeflowSettings(namespaces=(NS,), gate=GateMode.KUEUE, queue="lq"), api
    )
    try:
        spec = JobSpec(
            cluster="real",
            command=("python", "train.py"),
            checkpoint="/ckpt/{job}",
            options={"image": "i:1", "nodes": "2", **ALL},
        )
        ref = await backend.start(make_launch(new_job_id(), spec))
        name = ref.id.split("/")[1]
        status, tj = kube_lab.request(
            "GET", f"/apis/{TRAINJOBS.group}/{TRAINJOBS.version}/namespaces/{NS}/trainjobs/{name}"
        )
        assert status == 200, tj
        trainer: dict[str, Any] = tj["spec"]["trainer"]
        assert trainer["resourcesPerNode"] == {
            "requests": {"cpu": "4", "memory": "16Gi"},
            "limits": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "32Gi"},
        }
        (patch,) = tj["spec"]["runtimePatches"]
        (rj,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod = rj["template"]["spec"]["template"]["spec"]
        assert pod["nodeSelector"]["pool"] == "a100"
        assert {t["key"] for t in pod["tolerations"]} == {"nvidia.com/gpu", "dedicated", "spot"}
        assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "team-a-ckpt"
        assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == "/ckpt"
        # a value the API would refuse at submission is refused at launch too, not sent
        bad = JobSpec(cluster="real", command=("x",), options={"image": "i:1", "memory": "16GB"})
        with pytest.raises(LaunchRefusedError, match="memory"):
            await backend.start(make_launch(new_job_id(), bad))
    finally:
        await backend.aclose()
        api.close()
