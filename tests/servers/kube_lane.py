"""One test's view of the lane's real kube-apiserver: a namespace, the scripted controllers' store
(:class:`~tests.servers.kube_store_api.ApiStore`, as admin), an HTTP proxy the backend's client
goes through (:class:`~tests.servers.kube_proxy.KubeProxy`: faults on the wire, at an exact
request or event), and the fault helpers the Kubeflow tests use.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from kubernetes import client as k8s

from tests.servers.kube import KubeApiServer
from tests.servers.kube_proxy import KubeProxy
from tests.servers.kube_resources import JOBS, JOBSETS, NODES, PODS, TRAINJOBS, WORKLOADS, ApiError
from tests.servers.kube_store_api import ApiStore

__all__ = ["RealKube"]


class RealKube:
    """The lane's server for one test in ``namespace`` (see the module docstring)."""

    harness_settings: dict[str, Any] = {  # noqa: RUF012 - read only
        # kube-apiserver 1.20.2 sends no watch BOOKMARK on a quiet stream (measured: none in
        # 30 s and 75 s watches of the cached TrainJobs or the uncached pods), so a decision
        # waiting for the watches to confirm a TrainJob's resourceVersion goes ahead after
        # evidence_wait_s (60 s by default) while every watch is healthy. The tests wait 3 s,
        # not a minute.
        "evidence_wait_s": 3.0,
        "watch_timeout_s": 5.0,
    }

    def __init__(self, lab: KubeApiServer, namespace: str, *, token: str | None = None) -> None:
        """Args:
        lab: the session's server.
        namespace: the test's namespace (made if missing; emptied first).
        token: the bearer token of the backend's clients (the admin's by default).
        """
        self.lab = lab
        self.namespace = namespace
        self.token = token
        lab.ensure_namespace(namespace)
        self.admin = lab.api_client()
        self.store = ApiStore(lab.url, lab.admin_token, str(lab.ca_file), namespace)
        self.reset()
        self.proxy = KubeProxy(
            ("127.0.0.1", lab.port), lab.ca_file, lab.key_file, lab.ca_file
        ).start()

    def api_client(self, token: str | None = None) -> Any:
        """A client through the proxy, as the backend's (``token`` or the test's)."""
        cfg = self.lab.configuration(token or self.token)
        cfg.host = self.proxy.url
        return k8s.ApiClient(cfg)

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """The server unreachable for the backend's clients for the block's duration (the
        proxy refuses every connection)."""
        with self.proxy.refusing():
            yield

    def drop_watches(self, *, abrupt: bool = False, path_contains: str | None = None) -> int:
        """Cut the backend's open watches (whose path contains ``path_contains``, or all)."""
        return self.proxy.drop_watches(abrupt=abrupt, path_contains=path_contains)

    def expire_watch_cache(self) -> None:
        """Make the backend's pod watch resume from a resourceVersion etcd no longer has.

        The lane serves pod watches from etcd (``--watch-cache-sizes=pods#0``); while the
        backend's connections are refused, two writes move etcd on and etcd is compacted
        (what kube-apiserver does every 5 minutes), so the resumed watch is answered 410
        Expired by the real server.
        """
        with self.proxy.refusing():
            self.move_etcd_on_and_compact()

    def move_etcd_on_and_compact(self) -> None:
        """Two writes (etcd's revision moves past every watch's), then etcd compacted: a watch
        resumed from before is answered 410 Expired by the real server."""
        core: Any = k8s.CoreV1Api(self.admin)
        for i in range(2):
            name = f"compaction-{int(time.monotonic() * 1000)}-{i}"
            core.create_namespaced_config_map(self.namespace, {"metadata": {"name": name}})
            core.delete_namespaced_config_map(name, self.namespace)
        self.lab.compact()

    def reset(self) -> None:
        """Delete every object of the Kubeflow kinds in the namespace, and this namespace's
        nodes, at once (finalizers removed, grace 0), and wait until they are gone."""
        deadline = time.monotonic() + 120
        while True:
            left = 0
            for rt in (TRAINJOBS, JOBSETS, WORKLOADS, JOBS, PODS, NODES):
                items, _, _ = self.store.list_objects(rt)
                for obj in items:
                    left += 1
                    name = obj["metadata"]["name"]
                    with contextlib.suppress(ApiError):
                        if obj["metadata"].get("finalizers"):
                            self.store.patch(
                                rt, None, name, "merge", {"metadata": {"finalizers": None}}
                            )
                    with contextlib.suppress(ApiError):
                        self.store.delete(
                            rt, None, name, grace_period_seconds=0, propagation_policy="Background"
                        )
            if not left:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{left} objects left in {self.namespace} after 120 s")
            time.sleep(0.1)

    def close(self) -> None:
        """Empty the namespace, stop the proxy, close the admin client."""
        try:
            self.reset()
        finally:
            self.proxy.stop()
            self.admin.close()
