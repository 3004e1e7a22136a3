"""The real-apiserver lane's CRD adaptation for kube-apiserver 1.20 (``tests/servers/kube_crds``):
exactly the edits the recipe measured, nothing else. (That 1.20 then accepts them is shown by
every test on the lane: ``kube_lab`` installs them and waits for Established.)"""

from __future__ import annotations

import copy
from typing import Any

from tests.servers.kube_crds import adapt_for_1_20, lane_crds, load_crd


def _walk(node: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(node, dict):
        out.append(node)
        for value in node.values():
            out.extend(_walk(value))
    elif isinstance(node, list):
        for value in node:
            out.extend(_walk(value))
    return out


def test_the_recipe_counts_24_defaults_in_trainjobs_90_in_all_and_3_keys() -> None:
    adapted = lane_crds()
    names = [a.crd["metadata"]["name"] for a in adapted]
    assert names == [
        "trainjobs.trainer.kubeflow.org",
        "trainingruntimes.trainer.kubeflow.org",
        "clustertrainingruntimes.trainer.kubeflow.org",
        "jobsets.jobset.x-k8s.io",
        "workloads.kueue.x-k8s.io",
    ]
    assert adapted[0].defaults_dropped == 24
    assert sum(a.defaults_dropped for a in adapted) == 90
    assert sum(a.keys_required for a in adapted) == 3


def test_no_empty_default_is_left_and_every_map_key_is_required_or_defaulted() -> None:
    for adapted in lane_crds():
        nodes = _walk(adapted.crd)
        assert not [n for n in nodes if n.get("default") == "" and n.get("type") == "string"]
        for node in nodes:
            keys = node.get("x-kubernetes-list-map-keys")
            if not keys:
                continue
            items = node["items"]
            for key in keys:
                prop = items.get("properties", {}).get(key)
                if prop is not None:
                    assert "default" in prop or key in items.get("required", ()), key


def test_nothing_else_changes_and_the_source_is_untouched() -> None:
    source = load_crd("trainer.kubeflow.org_trainjobs.yaml")
    before = copy.deepcopy(source)
    adapted = adapt_for_1_20(source)
    assert source == before
    # CEL rules stay in the CRD (1.20 ignores them; the unit tests check them)
    assert any("x-kubernetes-validations" in n for n in _walk(adapted.crd))
    again = adapt_for_1_20(adapted.crd)
    assert again.defaults_dropped == 0
    assert again.keys_required == 0
    assert again.crd == adapted.crd
