"""scripts/kube-apiserver.sh picks its binaries as documented: $DISPATCH_KUBE_APISERVER (a binary
or its gzip), then ../shared/tools, and refuses one that is not kube-apiserver v1.20.2; etcd from
$DISPATCH_ETCD. (The build from Debian's source, the last resort, takes about 30 min and is not
run here; CI has ../shared.)"""

from __future__ import annotations

import gzip
import os
import stat
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "kube-apiserver.sh"


def _fake(path: Path, version: str) -> Path:
    path.write_text(f"#!/bin/sh\necho '{version}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    etcd = _fake(tmp_path / "etcd", "etcd Version: 3.5.1")
    full = {
        "PATH": os.environ["PATH"],
        "KUBE_LAB_DIR": str(tmp_path / "lab"),
        "DISPATCH_ETCD": str(etcd),
        "DISPATCH_SHARED": str(tmp_path / "no-shared"),
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), "install"], env=full, capture_output=True, text=True, timeout=60
    )


def test_a_binary_named_by_the_variable_is_used_as_it_is(tmp_path: Path) -> None:
    binary = _fake(tmp_path / "kube-apiserver", "Kubernetes v1.20.2")
    done = _run(tmp_path, DISPATCH_KUBE_APISERVER=str(binary))
    assert done.returncode == 0, done.stderr
    recorded = (tmp_path / "lab" / "env").read_text()
    assert f"KUBE_APISERVER={binary}\n" in recorded
    assert f"ETCD={tmp_path / 'etcd'}\n" in recorded


def test_a_gzip_named_by_the_variable_is_unpacked_into_the_lab_dir(tmp_path: Path) -> None:
    binary = _fake(tmp_path / "src", "Kubernetes v1.20.2")
    packed = tmp_path / "kube-apiserver.gz"
    packed.write_bytes(gzip.compress(binary.read_bytes()))
    done = _run(tmp_path, DISPATCH_KUBE_APISERVER=str(packed))
    assert done.returncode == 0, done.stderr
    unpacked = tmp_path / "lab" / "kube-apiserver"
    assert os.access(unpacked, os.X_OK)
    assert f"KUBE_APISERVER={unpacked}\n" in (tmp_path / "lab" / "env").read_text()


def test_the_shared_tools_gzip_is_found_beside_the_checkout(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "tools").mkdir(parents=True)
    binary = _fake(tmp_path / "src", "Kubernetes v1.20.2")
    (shared / "tools" / "kube-apiserver-1.20.2-linux-amd64.gz").write_bytes(
        gzip.compress(binary.read_bytes())
    )
    done = _run(tmp_path, DISPATCH_SHARED=str(shared))
    assert done.returncode == 0, done.stderr
    assert "from " + str(shared / "tools") in done.stdout


def test_another_version_is_refused(tmp_path: Path) -> None:
    binary = _fake(tmp_path / "kube-apiserver", "Kubernetes v1.19.0")
    done = _run(tmp_path, DISPATCH_KUBE_APISERVER=str(binary))
    assert done.returncode == 1
    assert "is not kube-apiserver v1.20.2" in done.stderr
    assert not (tmp_path / "lab" / "env").exists()


def test_env_says_so_when_nothing_was_installed(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "env"],
        env={"PATH": os.environ["PATH"], "KUBE_LAB_DIR": str(tmp_path / "none")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "not installed" in done.stderr
