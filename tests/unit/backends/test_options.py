"""A spec's options checked at submission (libs/dispatch_backends/options.py): refused
exactly when the cluster's backend would refuse them at launch, naming the option."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from dispatch_backends import InvalidOption, check_options, load_clusters
from dispatch_backends.config import (
    ClusterConfig,
    KubeflowCluster,
    LocalCluster,
    SlurmCluster,
)
from dispatch_backends.kubeflow.body import InvalidLaunch, namespace_of, trainjob_body
from dispatch_backends.kubeflow.settings import GateMode
from dispatch_backends.local import OPTIONS as LOCAL_OPTIONS
from dispatch_backends.slurm.script import InvalidSpec, sbatch_args
from dispatch_backends.time_limit import parse_time_limit
from dispatch_cli.jobfile import PolicyFlags, build_submission
from dispatch_core.state import JobSpec
from services.api.schemas import SubmitRequest, decode_body
from tests.contract.backend_contract import make_launch

REPO = Path(__file__).resolve().parents[3]
LOCAL = LocalCluster(name="local", data_dir="/nonexistent/never-made")
SLURM = SlurmCluster(name="hpc")
KUBE = KubeflowCluster(name="gke", namespaces=("team-a", "team-b"), queue="lq")
KUBE_NO_QUEUE = KubeflowCluster(name="gke")
KUBE_SUSPEND = KubeflowCluster(name="gke", gate=GateMode.SUSPEND)


def refused(cluster: ClusterConfig, options: dict[str, str]) -> InvalidOption:
    with pytest.raises(InvalidOption) as info:
        check_options(cluster, options)
    return info.value


# -- the time parser every backend shares ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1", 60),
        ("30:00", 1800),
        ("0:05", 5),
        ("1:2:3", 3723),
        ("04:00:00", 14400),
        ("1-2", 93600),
        ("1-2:3", 93780),
        ("1-2:3:4", 93784),
        ("0", None),
        ("UNLIMITED", None),
        ("infinite", None),
        ("-1", None),  # sbatch's own spelling of no limit
    ],
)
def test_slurm_time_formats_parse(text: str, seconds: int | None) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize(
    "text", ["banana", "", "1:2:3:4", "1.5", "-", ":", "1::", "1-2:3:4:5", "²", "1h"]
)
def test_what_sbatch_refuses_is_refused_with_the_formats(text: str) -> None:
    """Each of these is refused by sbatch 'Invalid --time specification' (checked on the
    Slurm test cluster with ``sbatch --test-only``)."""
    with pytest.raises(ValueError, match=r"invalid time limit .*D-H:M:S"):
        parse_time_limit(text)


@pytest.mark.parametrize("text", ["1-", "-5"])
def test_forms_outside_the_documented_ones_are_refused(text: str) -> None:
    """sbatch also takes these (an empty days or hours part), but man sbatch doesn't list
    them and their meaning is a guess, so dispatch refuses them on every backend."""
    with pytest.raises(ValueError, match="invalid time limit"):
        parse_time_limit(text)


def test_the_local_backend_exports_the_shared_parser() -> None:
    """One parser: ``dispatch_backends.local.parse_time_limit`` (its old home) is it."""
    from dispatch_backends import local

    assert local.parse_time_limit is parse_time_limit


# -- local: only the options it reads ---------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"time": "30:00"}, {"chdir": "/work", "time": "UNLIMITED"}, {"chdir": ""}],
)
def test_local_accepts_the_options_it_reads(options: dict[str, str]) -> None:
    check_options(LOCAL, options)


def test_local_refuses_a_bad_time_naming_it() -> None:
    err = refused(LOCAL, {"chdir": "/work", "time": "banana"})
    assert err.key == "time"
    assert "invalid time limit 'banana'" in str(err)


@pytest.mark.parametrize("key", ["partitionn", "partition", "Time", "nodes"])
def test_local_refuses_an_option_it_doesnt_read_listing_the_known_ones(key: str) -> None:
    err = refused(LOCAL, {"time": "1", key: "gpu"})
    assert err.key == key
    assert f"no option {key!r}" in str(err)
    assert "(its options: chdir, time)" in str(err)
    assert sorted(LOCAL_OPTIONS) == ["chdir", "time"]


# -- slurm: names pass through to sbatch; the values the backend reads are checked -------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"partition": "gpu", "time": "1-12:00:00"},
        {"partitionn": "gpu"},  # passed to sbatch as --partitionn=gpu; sbatch decides
        {"exclusive": "", "mem_per_cpu": "1G", "requeue": "yes", "exclude": "n1,n2"},
        {"time": "0"},
    ],
)
def test_slurm_accepts_what_sbatch_args_accepts(options: dict[str, str]) -> None:
    check_options(SLURM, options)
    sbatch_args(make_launch("ok", JobSpec(cluster="hpc", command=("x",), options=options)), SLURM)


@pytest.mark.parametrize(
    ("options", "key", "words"),
    [
        ({"time": "banana"}, "time", "invalid time limit 'banana'"),
        ({"partition": "gpu", "time": "1:2:3:4"}, "time", "invalid time limit"),
        ({"requeue": "maybe"}, "requeue", "yes or no"),
        ({"job_name": "mine"}, "job_name", "dispatch's own"),
        ({"array": "1-3"}, "array", "dispatch's own"),
        ({"Partition": "gpu"}, "Partition", "not an sbatch option name"),
        ({"--time": "1"}, "--time", "not an sbatch option name"),
    ],
)
def test_slurm_refuses_what_its_launch_refuses(
    options: dict[str, str], key: str, words: str
) -> None:
    err = refused(SLURM, options)
    assert err.key == key
    assert words in str(err)
    launch = make_launch("bad", JobSpec(cluster="hpc", command=("x",), options=options))
    with pytest.raises(InvalidSpec, match=words):
        sbatch_args(launch, SLURM)


# -- kubeflow: unknown names ignored; the values it reads are checked ---------------------------


@pytest.mark.parametrize(
    ("cluster", "options"),
    [
        (KUBE, {}),
        (KUBE, {"partition": "gpu", "chdir": "/work"}),  # not read here: ignored, as at launch
        (KUBE, {"namespace": "team-b", "nodes": "2", "gpus": "8", "procs_per_node": "4"}),
        (KUBE, {"time": "2:00:00", "image": "x", "priority_class": "high"}),
        (KUBE_NO_QUEUE, {"queue": "lq"}),
        (KUBE_SUSPEND, {}),
        (KUBE, {"cpu": "500m", "memory": "16Gi", "cpu_limit": "8", "memory_limit": "1.5Ti"}),
        (KUBE, {"tolerations": "a:NoSchedule,b=c:NoExecute,d", "node_selector": "pool=a100"}),
        (KUBE, {"checkpoint_pvc": "ckpt.team-a", "checkpoint_mount": "/mnt/ckpt/"}),
    ],
)
def test_kubeflow_accepts_what_a_trainjob_can_be_made_of(
    cluster: KubeflowCluster, options: dict[str, str]
) -> None:
    check_options(cluster, options)
    launch = make_launch("ok", JobSpec(cluster="gke", command=("x",), options=options))
    namespace_of(launch, cluster)
    trainjob_body(launch, cluster, "00000000")


@pytest.mark.parametrize(
    ("cluster", "options", "key", "words"),
    [
        (KUBE, {"time": "banana"}, "time", "invalid time limit 'banana'"),
        (KUBE, {"nodes": "0"}, "nodes", "expected at least 1"),
        (KUBE, {"gpus": "many"}, "gpus", "expected an integer"),
        (KUBE, {"procs_per_node": "1.5"}, "procs_per_node", "expected an integer"),
        (KUBE, {"namespace": "elsewhere"}, "namespace", "not one of this cluster's"),
        (KUBE_NO_QUEUE, {}, "queue", "needs a Kueue LocalQueue"),
        (KUBE_NO_QUEUE, {"queue": ""}, "queue", "needs a Kueue LocalQueue"),
        (KUBE, {"cpu": "four"}, "cpu", "positive Kubernetes quantity"),
        (KUBE, {"memory_limit": "1 Gi"}, "memory_limit", "positive Kubernetes quantity"),
        (KUBE, {"tolerations": "a:Always"}, "tolerations", "with an effect among"),
        (KUBE, {"node_selector": "a=b,c"}, "node_selector", "'c' is not label=value"),
        (KUBE, {"checkpoint_pvc": "-x"}, "checkpoint_pvc", "not a PersistentVolumeClaim name"),
        (KUBE, {"checkpoint_mount": "/x"}, "checkpoint_mount", "needs checkpoint_pvc"),
    ],
)
def test_kubeflow_refuses_what_its_launch_refuses(
    cluster: KubeflowCluster, options: dict[str, str], key: str, words: str
) -> None:
    err = refused(cluster, options)
    assert err.key == key
    assert words in str(err)
    launch = make_launch("bad", JobSpec(cluster="gke", command=("x",), options=options))

    def build() -> None:
        namespace_of(launch, cluster)
        trainjob_body(launch, cluster, "00000000")

    with pytest.raises(InvalidLaunch, match=words) as info:
        build()
    assert info.value.option == key


# -- the examples ---------------------------------------------------------------------------

EXAMPLE_JOB_FILES = sorted(
    path
    for path in (REPO / "examples").rglob("*.toml")
    if path.name not in ("clusters.toml", "policy.toml")
)


@pytest.mark.parametrize("path", EXAMPLE_JOB_FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_example_job_file_passes_its_backends_check(path: Path) -> None:
    """What ``dispatch submit`` sends for each example (``chdir`` added) passes the check of
    the cluster it names: ``local`` as ``dispatch up`` serves it, ``slurm`` as
    examples/slurm/clusters.toml declares it."""
    clusters: dict[str, ClusterConfig] = {
        "local": LOCAL,
        "slurm": load_clusters(REPO / "examples/slurm/clusters.toml").get("slurm"),
    }
    kw: dict[str, Any] = {"cluster": None, "name": None, "job_id": None, "reason": None}
    body = build_submission(path, **kw, chdir="/work", policy_file=None, flags=PolicyFlags())
    request = decode_body(SubmitRequest, msgspec.json.encode(body))
    check_options(clusters[request.spec.cluster], request.spec.options)
    assert EXAMPLE_JOB_FILES, "examples/ has job files"
