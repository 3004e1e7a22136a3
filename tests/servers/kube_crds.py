"""The CRDs of the real-apiserver lane: Kubeflow Trainer v2.3.0 adapted for kube-apiserver 1.20,
plus minimal JobSet and Kueue Workload CRDs.

The Trainer CRDs are read from ``tests/data/kubeflow-crds`` (the release's own files) and changed
only where kube-apiserver 1.20 refuses them (``shared/labs/kube-real/README.md``):

* 1.20 reads ``default: ""`` in a structural schema as null and refuses the CRD: those defaults
  are dropped (24 in ``trainjobs``, 90 in the three CRDs);
* 1.20 wants every ``x-kubernetes-list-map-keys`` key to have a default or be required: the keys
  without either are made required (3).

What 1.20 does not do (CEL ``x-kubernetes-validations``, ``fieldValidation=Strict``) is checked
by the unit tests against the unchanged CRD (``tests/fakes/kube_schema.py``).

JobSet and Workload have no controller here (a scripted one writes their statuses), so their
CRDs are stubs: any fields, a ``status`` subresource.

    python -m tests.servers.kube_crds OUT_DIR   # writes the adapted CRDs as JSON files
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CRD_DIR",
    "TRAINER_CRD_FILES",
    "Adapted",
    "adapt_for_1_20",
    "lane_crds",
    "minimal_crd",
]

CRD_DIR = Path(__file__).resolve().parent.parent / "data" / "kubeflow-crds"
TRAINER_CRD_FILES = (
    "trainer.kubeflow.org_trainjobs.yaml",
    "trainer.kubeflow.org_trainingruntimes.yaml",
    "trainer.kubeflow.org_clustertrainingruntimes.yaml",
)


@dataclass(frozen=True)
class Adapted:
    """One CRD adapted for 1.20, with what was changed."""

    crd: dict[str, Any]
    defaults_dropped: int
    keys_required: int


def _drop_empty_defaults(node: Any) -> int:
    count = 0
    if isinstance(node, dict):
        if node.get("default") == "" and node.get("type") == "string":
            del node["default"]
            count += 1
        for value in node.values():
            count += _drop_empty_defaults(value)
    elif isinstance(node, list):
        for value in node:
            count += _drop_empty_defaults(value)
    return count


def _require_map_keys(node: Any) -> int:
    count = 0
    if isinstance(node, dict):
        keys = node.get("x-kubernetes-list-map-keys")
        items = node.get("items") if keys else None
        if isinstance(items, dict):
            props = items.get("properties") or {}
            required = items.setdefault("required", [])
            for key in keys or ():
                if key in props and "default" not in props[key] and key not in required:
                    required.append(key)
                    count += 1
            if not required:
                del items["required"]
        for value in node.values():
            count += _require_map_keys(value)
    elif isinstance(node, list):
        for value in node:
            count += _require_map_keys(value)
    return count


def adapt_for_1_20(crd: dict[str, Any]) -> Adapted:
    """A copy of ``crd`` that kube-apiserver 1.20 accepts (see the module docstring)."""
    out = copy.deepcopy(crd)
    dropped = _drop_empty_defaults(out)
    required = _require_map_keys(out)
    return Adapted(out, dropped, required)


def minimal_crd(group: str, version: str, kind: str, plural: str) -> dict[str, Any]:
    """A namespaced CRD with any fields and a ``status`` subresource."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {
                "kind": kind,
                "plural": plural,
                "listKind": kind + "List",
                "singular": kind.lower(),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def load_crd(file_name: str) -> dict[str, Any]:
    """The (first) CRD document of ``tests/data/kubeflow-crds/<file_name>``."""
    with (CRD_DIR / file_name).open() as f:
        doc = next(d for d in yaml.safe_load_all(f) if d)
    if not isinstance(doc, dict):
        raise ValueError(f"{file_name} holds no CRD")
    return doc


def lane_crds() -> list[Adapted]:
    """Every CRD the lane installs: the three Trainer CRDs (adapted), JobSet, Workload."""
    out = [adapt_for_1_20(load_crd(name)) for name in TRAINER_CRD_FILES]
    out.append(Adapted(minimal_crd("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"), 0, 0))
    out.append(Adapted(minimal_crd("kueue.x-k8s.io", "v1beta2", "Workload", "workloads"), 0, 0))
    return out


def main(argv: list[str]) -> int:
    """Write the lane's CRDs as JSON into ``argv[0]``."""
    if len(argv) != 1:
        print("usage: python -m tests.servers.kube_crds OUT_DIR", file=sys.stderr)
        return 2
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    for adapted in lane_crds():
        name = adapted.crd["metadata"]["name"]
        (out_dir / f"{name}.json").write_text(json.dumps(adapted.crd, indent=1))
        print(
            f"{name}: {adapted.defaults_dropped} empty-string defaults dropped, "
            f"{adapted.keys_required} list-map keys made required"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
