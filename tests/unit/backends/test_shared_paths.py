"""``shared_paths``: which checkpoint roots a cluster's jobs can reach (issue 14, part 2,
``dispatch_backends.config.sees_checkpoint``)."""

from __future__ import annotations

import pytest

from dispatch_backends.config import (
    ClustersConfigError,
    KubeflowCluster,
    LocalCluster,
    SlurmCluster,
    parse_clusters,
    sees_checkpoint,
)


@pytest.mark.parametrize(
    ("root", "seen"),
    [
        ("s3://bucket/ckpt/{job}", True),
        ("/shared/ckpt/{job}", True),
        ("/shared", True),
        ("/shared/../etc", False),
        ("/shared2/ckpt", False),
        ("/tmp/dispatch-examples/digits", True),
        ("/data/ckpt", False),
        ("ckpt/relative", False),
    ],
)
def test_a_slurm_cluster_sees_s3_and_its_shared_paths_only(root: str, seen: bool) -> None:
    slurm = SlurmCluster(name="slurm", shared_paths=("/shared/", "/tmp/dispatch-examples"))
    assert sees_checkpoint(slurm, root) is seen


def test_a_cluster_without_shared_paths_sees_only_s3() -> None:
    assert not sees_checkpoint(SlurmCluster(name="slurm"), "/shared/ckpt")
    assert not sees_checkpoint(KubeflowCluster(name="kube"), "/shared/ckpt")
    assert sees_checkpoint(KubeflowCluster(name="kube"), "s3://b/ckpt")


def test_a_local_cluster_sees_every_path_unless_it_lists_some() -> None:
    everything = LocalCluster(name="local", data_dir="/var/lib/d")
    assert sees_checkpoint(everything, "/any/where")
    assert sees_checkpoint(everything, "relative/too")
    narrowed = LocalCluster(name="local", data_dir="/var/lib/d", shared_paths=("/scratch",))
    assert sees_checkpoint(narrowed, "/scratch/ckpt")
    assert not sees_checkpoint(narrowed, "/home/ckpt")
    assert sees_checkpoint(LocalCluster(name="l", data_dir="/d", shared_paths=("/",)), "/x")


def test_shared_paths_is_read_from_the_clusters_file() -> None:
    config = parse_clusters(
        {
            "clusters": [
                {"name": "slurm", "backend": "slurm", "shared_paths": ["/shared"]},
                {"name": "local", "backend": "local", "data_dir": "/d"},
            ]
        }
    )
    assert config.get("slurm").shared_paths == ("/shared",)
    assert config.get("local").shared_paths is None
    with pytest.raises(ClustersConfigError, match="shared_paths"):
        parse_clusters({"clusters": [{"name": "s", "backend": "slurm", "shared_paths": "/x"}]})
