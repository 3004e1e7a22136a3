"""The clusters file every service reads (``dispatch_backends.config``), with local clusters
(the slurm and kubeflow settings are tested with their backends)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatch_backends import ClustersConfigError, load_clusters, make_backend
from dispatch_backends.config import LocalCluster, poll_interval_s
from dispatch_backends.local import LocalBackend


def test_toml_and_json_say_the_same(tmp_path: Path) -> None:
    toml = tmp_path / "clusters.toml"
    toml.write_text(
        "[[clusters]]\n"
        'name = "local"\n'
        'backend = "local"\n'
        f'data_dir = "{tmp_path / "data"}"\n'
        "kill_wait_s = 2\n"
        "[[clusters]]\n"
        'name = "other"\n'
        'backend = "local"\n'
        'data_dir = "/elsewhere"\n'
        "retain_ended_s = 60\n"
    )
    as_json = tmp_path / "clusters.json"
    as_json.write_text(
        json.dumps(
            {
                "clusters": [
                    {
                        "name": "local",
                        "backend": "local",
                        "data_dir": str(tmp_path / "data"),
                        "kill_wait_s": 2,
                    },
                    {
                        "name": "other",
                        "backend": "local",
                        "data_dir": "/elsewhere",
                        "retain_ended_s": 60,
                    },
                ]
            }
        )
    )
    config = load_clusters(toml)
    assert config == load_clusters(as_json)
    assert config.names == ("local", "other")
    local = config.get("local")
    assert isinstance(local, LocalCluster)
    assert local.kill_wait_s == 2.0
    assert poll_interval_s(local) == 1.0


def test_make_backend_builds_the_local_backend_as_configured(tmp_path: Path) -> None:
    path = tmp_path / "clusters.json"
    path.write_text(
        json.dumps(
            {
                "clusters": [
                    {
                        "name": "here",
                        "backend": "local",
                        "data_dir": str(tmp_path / "d"),
                        "node_loss_window_s": 5,
                    },
                ]
            }
        )
    )
    config = load_clusters(path)
    backend = make_backend(config.get("here"))
    assert isinstance(backend, LocalBackend)
    assert backend.cluster == "here"
    assert backend.declarations().node_loss_window_s == 5.0


@pytest.mark.parametrize(
    ("clusters", "message"),
    [
        ([{"name": "a", "backend": "local", "data_dir": "/d", "kill_wiat_s": 1}], "kill_wiat_s"),
        ([{"name": "a", "backend": "lsf"}], "lsf"),
        ([{"name": "A.b", "backend": "local", "data_dir": "/d"}], "subject token"),
        (
            [
                {"name": "a", "backend": "local", "data_dir": "/d"},
                {"name": "a", "backend": "local", "data_dir": "/e"},
            ],
            "listed twice",
        ),
        ([{"name": "a", "backend": "local"}], "data_dir"),
    ],
)
def test_an_invalid_file_is_refused_naming_what_is_wrong(
    tmp_path: Path, clusters: list[dict[str, object]], message: str
) -> None:
    path = tmp_path / "clusters.json"
    path.write_text(json.dumps({"clusters": clusters}))
    with pytest.raises(ClustersConfigError, match=message):
        load_clusters(path)


def test_unknown_cluster_and_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("clusters = [")
    with pytest.raises(ClustersConfigError, match="not valid TOML"):
        load_clusters(path)
    with pytest.raises(ClustersConfigError, match="cannot read"):
        load_clusters(tmp_path / "missing.toml")
    path.write_text("clusters = []\n")
    with pytest.raises(ClustersConfigError, match="no cluster named 'x'"):
        load_clusters(path).get("x")
