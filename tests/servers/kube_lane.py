"""One test's view of the lane's real kube-apiserver: a namespace, the scripted controllers' store
(:class:`~tests.servers.kube_store_api.ApiStore`, as admin), a TCP proxy the backend's client goes
through (for faults on the wire), and the fault helpers the Kubeflow tests use.

It offers the parts of the fake API server's surface that the Kubeflow harness reads
(``store``, ``api_client()``, ``faults.fail_next``/``faults.clear`` as a real outage), so the
same tests run on the real server.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from kubernetes import client as k8s

from tests.fakes.kube_store import JOBS, JOBSETS, NODES, PODS, TRAINJOBS, WORKLOADS, ApiError
from tests.servers.kube import KubeApiServer
from tests.servers.kube_proxy import TcpProxy
from tests.servers.kube_store_api import NODE_OWNER_LABEL, ApiStore

__all__ = ["RealKube"]


class _Outage:
    """``faults.fail_next``/``clear`` of the fake, as a real outage: the proxy refuses every
    connection of the backend's client until cleared."""

    def __init__(self, proxy: TcpProxy) -> None:
        self._proxy = proxy
        self._held: contextlib.ExitStack | None = None

    def fail_next(self, *_: Any, **__: Any) -> None:
        if self._held is None:
            self._held = contextlib.ExitStack()
            self._held.enter_context(self._proxy.refusing())

    def clear(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None


class RealKube:
    """The lane's server for one test in ``namespace`` (see the module docstring)."""

    harness_settings: dict[str, Any] = {  # noqa: RUF012 - read only
        # A real kube-apiserver sends a watch BOOKMARK about once a minute from its watch
        # cache, none before a short watch's timeout, and none at all for a resource served
        # without a cache (pods here): a decision waiting for the watches to confirm a
        # TrainJob's resourceVersion goes ahead after evidence_wait_s (60 s by default) while
        # every watch is healthy. The tests wait 3 s, not a minute.
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
        self.proxy = TcpProxy(("127.0.0.1", lab.port)).start()
        self.faults = _Outage(self.proxy)

    def api_client(self, token: str | None = None) -> Any:
        """A client through the proxy, as the backend's (``token`` or the test's)."""
        cfg = self.lab.configuration(token or self.token)
        cfg.host = self.proxy.url
        return k8s.ApiClient(cfg)

    def drop_watches(self, **_: Any) -> int:
        """Cut every connection of the backend's clients (its watches drop mid-stream)."""
        return self.proxy.cut()

    def expire_watch_cache(self, *_: Any) -> None:
        """Make the backend's pod watch resume from a resourceVersion etcd no longer has.

        The lane serves pod watches from etcd (``--watch-cache-sizes=pods#0``); while the
        backend's connections are refused, two writes move etcd on and etcd is compacted
        (what kube-apiserver does every 5 minutes), so the resumed watch is answered 410
        Expired by the real server.
        """
        with self.proxy.refusing():
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


_ = NODE_OWNER_LABEL
