"""The clusters file every service reads (libs/dispatch_backends/config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch_backends import ClustersConfigError, declarations_of, load_clusters
from dispatch_backends.config import KubeflowCluster, LocalCluster, SlurmCluster, make_backend
from dispatch_core import Action

CLUSTERS = """
[[clusters]]
name = "local"
backend = "local"
data_dir = "{data}"
node_loss_window_s = 30

[[clusters]]
name = "slurm-a"
backend = "slurm"
node_loss_window_s = 120

[[clusters]]
name = "gke-a"
backend = "kubeflow"
namespaces = ["training"]
gate = "suspend"
node_loss_window_s = 240
"""


def test_every_backend_kind_parses_and_declares_without_acting(tmp_path: Path) -> None:
    """Each entry becomes its backend's settings; the declarations a plan is made against
    come out without a Kubernetes client (no kubeconfig exists here)."""
    path = tmp_path / "clusters.toml"
    path.write_text(CLUSTERS.format(data=tmp_path / "local"))
    clusters = load_clusters(path)
    local, slurm, kube = (clusters.get(n) for n in ("local", "slurm-a", "gke-a"))
    assert isinstance(local, LocalCluster)
    assert isinstance(slurm, SlurmCluster)
    assert isinstance(kube, KubeflowCluster)
    assert kube.namespaces == ("training",)
    assert declarations_of(local).node_loss_window_s == 30
    assert declarations_of(slurm).native_actions == frozenset({Action.REQUEUE})
    kube_declared = declarations_of(kube)
    assert kube_declared.node_loss_window_s == 240
    assert kube_declared.cessation_signal
    assert kube_declared.emergency_stop
    assert make_backend(local).declarations() == declarations_of(local)


def test_an_unknown_setting_is_refused_naming_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "clusters.toml"
    path.write_text('[[clusters]]\nname = "gke-a"\nbackend = "kubeflow"\nnamespace = "typo"\n')
    with pytest.raises(ClustersConfigError, match="namespace"):
        load_clusters(path)
