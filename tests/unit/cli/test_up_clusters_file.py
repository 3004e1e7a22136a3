"""``dispatch up --clusters FILE``: how FILE is checked and what ``up`` writes for the
services (libs/dispatch_cli/clusters.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch_backends.config import LocalCluster, SlurmCluster, load_clusters
from dispatch_cli.clusters import (
    BUILTIN,
    backend_of,
    builtin_cluster,
    clusters_document,
    read_clusters_file,
)
from dispatch_cli.errors import EXIT_USAGE, UsageError

REPO = Path(__file__).resolve().parents[3]


def _builtin(tmp_path: Path) -> LocalCluster:
    return builtin_cluster(tmp_path / "data", kill_wait_s=10.0)


def test_the_merged_file_is_read_back_by_the_services_loader(tmp_path: Path) -> None:
    """The built-in cluster and FILE's, re-encoded as JSON, load as they were (a local
    ``retain_ended_s`` of null included, which TOML can't spell)."""
    builtin = _builtin(tmp_path)
    more = LocalCluster(name="b", data_dir=str(tmp_path / "b"), retain_ended_s=None)
    slurm = SlurmCluster(name="hpc", node_loss_window_s=60.0, extra_args=("--account=ml",))
    merged = tmp_path / "clusters.json"
    merged.write_bytes(clusters_document((builtin, more, slurm)))
    assert load_clusters(merged).clusters == (builtin, more, slurm)
    assert [backend_of(c) for c in (builtin, more, slurm)] == ["local", "local", "slurm"]


def test_relative_paths_are_taken_from_the_files_directory(tmp_path: Path) -> None:
    """The services run in <data dir>/work: a relative path of FILE is made absolute against
    FILE's directory, ``~`` expanded; absolute paths and unset ones are kept."""
    conf = tmp_path / "conf"
    conf.mkdir()
    path = conf / "clusters.toml"
    path.write_text(
        '[[clusters]]\nname = "b"\nbackend = "local"\ndata_dir = "../b-objects"\n'
        '[[clusters]]\nname = "hpc"\nbackend = "slurm"\noutput_dir = "logs"\n'
        'workdir = "/abs/work"\nslurm_conf = "~/slurm.conf"\n'
    )
    local, slurm = read_clusters_file(path, builtin=_builtin(tmp_path))
    assert isinstance(local, LocalCluster)
    assert local.data_dir == str(tmp_path / "b-objects")
    assert local.workdir is None
    assert isinstance(slurm, SlurmCluster)
    assert slurm.output_dir == str(conf / "logs")
    assert slurm.workdir == "/abs/work"
    assert slurm.slurm_conf == str(Path("~/slurm.conf").expanduser())
    assert slurm.bin_dir == ""


def test_two_local_clusters_of_the_file_may_not_share_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "clusters.json"
    path.write_text(
        '{"clusters": [{"name": "a", "backend": "local", "data_dir": "shared"},'
        ' {"name": "b", "backend": "local", "data_dir": "./shared/"}]}'
    )
    with pytest.raises(UsageError, match=r"cluster 'b': data_dir .* is that of cluster 'a'") as err:
        read_clusters_file(path, builtin=_builtin(tmp_path))
    assert err.value.exit_code == EXIT_USAGE


def test_the_built_in_name_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "clusters.toml"
    path.write_text(f'[[clusters]]\nname = "{BUILTIN}"\nbackend = "slurm"\n')
    with pytest.raises(UsageError, match="dispatch up's own local cluster") as err:
        read_clusters_file(path, builtin=_builtin(tmp_path))
    assert str(path) in err.value.message


def test_the_slurm_examples_clusters_file_is_accepted() -> None:
    """``examples/slurm/clusters.toml`` names cluster ``slurm``, which the example job files
    submit to."""
    path = REPO / "examples" / "slurm" / "clusters.toml"
    (cluster,) = read_clusters_file(path, builtin=builtin_cluster(Path("/nowhere"), kill_wait_s=1))
    assert isinstance(cluster, SlurmCluster)
    assert cluster.name == "slurm"
    for job in ("digits.toml", "digits-requeue.toml"):
        assert 'cluster = "slurm"' in (path.parent / job).read_text()
