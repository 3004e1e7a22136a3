"""Each cluster kind describes itself (issue 11 item 6): one table of kinds, and every kind
answers the same questions (build, declare, check options, poll interval, path fields)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from dispatch_backends import InvalidOption, check_options, declarations_of
from dispatch_backends.config import (
    CLUSTER_KINDS,
    DEFAULT_POLL_INTERVAL_S,
    ClusterConfig,
    ClusterKind,
    KubeflowCluster,
    LocalCluster,
    SlurmCluster,
    parse_clusters,
    poll_interval_s,
)


def entries(tmp_path: Path) -> list[ClusterConfig]:
    return [
        LocalCluster(name="local", data_dir=str(tmp_path / "local")),
        SlurmCluster(name="hpc"),
        KubeflowCluster(name="kube", queue="q"),
    ]


def test_the_table_of_kinds_is_the_clusters_file_union() -> None:
    assert (LocalCluster, SlurmCluster, KubeflowCluster) == CLUSTER_KINDS
    assert DEFAULT_POLL_INTERVAL_S == {"local": 1.0, "slurm": 3.0, "kubeflow": 5.0}


def test_every_kind_describes_itself(tmp_path: Path) -> None:
    for cluster in entries(tmp_path):
        kind: ClusterKind = cluster
        tag = type(cluster).__struct_config__.tag
        assert kind.kind == tag, f"{cluster}: kind {kind.kind!r}, backend field {tag!r}"
        assert poll_interval_s(kind) == DEFAULT_POLL_INTERVAL_S[kind.kind]
        fields = {f.name for f in msgspec.structs.fields(type(cluster))}
        assert set(kind.path_fields) <= fields, f"{kind.kind}: {kind.path_fields}"
        assert declarations_of(kind) == kind.declarations()
        assert declarations_of(kind).node_loss_window_s > 0
        check_options(kind, {"time": "1:00"})  # every backend reads Slurm's time format
        with pytest.raises(InvalidOption) as refused:
            check_options(kind, {"time": "soon"})
        assert refused.value.key == "time", f"{kind.kind}: {refused.value}"


def test_a_kind_parsed_from_the_file_answers_as_one_built_in_code(tmp_path: Path) -> None:
    config = parse_clusters(
        {
            "clusters": [
                {"name": "a", "backend": "local", "data_dir": str(tmp_path / "a")},
                {"name": "b", "backend": "slurm"},
            ]
        }
    )
    local, slurm = config.clusters
    assert (local.kind, slurm.kind) == ("local", "slurm")
    assert local.make_backend().declarations() == local.declarations()
    with pytest.raises(InvalidOption) as refused:
        local.check_options({"partition": "gpu"})
    assert refused.value.key == "partition"
