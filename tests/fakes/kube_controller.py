"""TEST DOUBLE: a scripted cluster simulator that writes the statuses Kubernetes controllers would.

It stands in for the Trainer, JobSet, Job (kube-controller-manager), Kueue, scheduler, taint
manager and kubelet controllers, writing through the real kube-apiserver of the lane
(:class:`tests.servers.kube_store_api.ApiStore`: real resourceVersions, status subresources and
watches), so every change reaches the backend's watches as a real one would. A test states each
scenario step explicitly.

Two kinds of behaviour:

- :meth:`ClusterSimulator.settle` runs every controller's *ordinary* reconcile to a fixed point:
  a TrainJob gets its JobSet (same name, controller owner reference), the JobSet its Job
  ``<name>-node-0`` (Indexed, ``parallelism = completions = numNodes``, ``backoffLimit: 0``), the
  Job its pods ``<job>-<index>-<suffix>`` with the JobSet and Job labels; pods are scheduled to
  Ready nodes and run; ``spec.suspend`` propagates down and pods go; statuses propagate up
  (pod -> Job -> JobSet -> TrainJob); the kubelet confirms deletions on Ready nodes only; Kueue
  gates and admits queued TrainJobs. :meth:`start` runs it in a background thread after every
  change, for tests that drive the backend asynchronously.
- Scenario steps, each named after the facts file (``shared/labs/kubeflow-facts.md``, cited per
  method), change what a real cluster would change and then settle: :meth:`succeed`,
  :meth:`fail`, :meth:`oom_kill`, :meth:`exceed_deadline`, :meth:`preempt_by_scheduler`,
  :meth:`kueue_evict`, :meth:`lose_node`, :meth:`restore_node`, :meth:`delete_node`,
  :meth:`fail_with_reason`, :meth:`expire_finished_jobset` and :meth:`admit`.

With a :class:`~tests.servers.kubelet.FakeKubelet` (``kubelet=``), nodes point at it and the
pods' containers run there, so the server's pod log requests read what :meth:`write_log`
printed.

Simplifications (a simulator, not the controllers): pods use ``restartPolicy: Never``; the
runtime is always a single ``node`` replicated job (Trainer's torch runtime shape) and initializer
jobs are not simulated; JobSet restarts only with ``max_restarts`` set (``RestartJobSet``, no
per-rule matching); only the ``labels``/``annotations``/``env`` of ``spec.runtimePatches`` reach
the pods; Kueue has no quota model (it admits at once unless told to hold) and writes a
simplified ``runtimePatches`` entry.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Self

from tests.servers.kube_resources import (
    JOBS,
    JOBSETS,
    NODES,
    PODS,
    TRAINJOBS,
    WORKLOADS,
    AdmissionDenied,
    ApiError,
    JsonObject,
    ResourceType,
    format_time,
)
from tests.servers.kube_store_api import ApiStore
from tests.servers.kubelet import FakeKubelet

__all__ = ["ADMISSION_GATED_BY", "QUEUE_NAME_LABEL", "ClusterSimulator", "train_job_body"]

TRAINER_MANAGER = "trainer.kubeflow.org/trainjob-controller"
KUEUE_MANAGER = "kueue.x-k8s.io/manager"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
ADMISSION_GATED_BY = "kueue.x-k8s.io/admission-gated-by"
REPLICATED_JOB = "node"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"

TrainerVersion = Literal["v2.3.0", "main"]


def _conditions(obj: Mapping[str, Any]) -> list[JsonObject]:
    return list(obj.get("status", {}).get("conditions") or [])


def _condition(obj: Mapping[str, Any], kind: str) -> JsonObject | None:
    return next((c for c in _conditions(obj) if c.get("type") == kind), None)


def _is_true(obj: Mapping[str, Any], kind: str) -> bool:
    cond = _condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


def _owner_ref(owner: Mapping[str, Any], kind: str, api_version: str) -> JsonObject:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _owned_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    uid = owner["metadata"]["uid"]
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or ())


class ClusterSimulator:
    """Scripted controllers writing through the lane's server (see the module docstring)."""

    def __init__(
        self,
        store: ApiStore,
        *,
        nodes: Sequence[str] = ("node-a", "node-b", "node-c", "node-d"),
        trainer_version: TrainerVersion = "v2.3.0",
        max_restarts: int | None = None,
        kueue_admission_gated_by: bool = True,
        kubelet: FakeKubelet | None = None,
    ) -> None:
        """Create the simulator and its Ready nodes (Kueue's admission webhooks are
        :meth:`kueue_webhook`, for a test that registers it on the server).

        Args:
            store: the lane's server, as the admin, in one namespace.
            nodes: names of the Ready nodes to create.
            trainer_version: ``v2.3.0`` reproduces the release's clearing of ``Failed`` when the
                JobSet is gone (facts B1, kubeflow/trainer #3779); ``main`` has fix #3891.
            max_restarts: JobSet ``failurePolicy.maxRestarts``; None means no failurePolicy, so the
                first failed Job fails the JobSet with ``FailedJobs`` (facts B2).
            kueue_admission_gated_by: whether Kueue's ``AdmissionGatedBy`` feature is on
                (beta, on by default from Kueue v0.19; facts B4).
            kubelet: the fake kubelet (``tests/servers/kubelet.py``) every node's kubelet
                endpoint points at (``status.addresses`` ``InternalIP`` 127.0.0.1 and
                ``daemonEndpoints``), so the server's pod log requests reach it: a pod's
                containers are run there when the pod runs, exit when it ends, and are forgotten
                when it is deleted; :meth:`write_log` prints to a pod. ``None``: nodes have no
                address, and the server can read no log.
        """
        self.store = store
        self.trainer_version = trainer_version
        self.max_restarts = max_restarts
        self.kueue_admission_gated_by = kueue_admission_gated_by
        self.kubelet = kubelet
        self.held: set[tuple[str, str]] = set()
        """TrainJobs (namespace, name) that Kueue must not admit until :meth:`admit`."""
        self._next_node = 0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[BaseException] = []
        """Exceptions raised by background reconciles (a test should assert it stays empty)."""
        for name in nodes:
            self.add_node(name)

    # -- running --------------------------------------------------------------------------------

    def settle(self, max_passes: int = 200) -> None:
        """Run every controller's reconcile until nothing changes.

        Raises:
            AssertionError: the controllers did not converge (a simulator bug).
        """
        with self.store.lock:
            for _ in range(max_passes):
                before = self.store.resource_version()
                try:
                    self._reconcile_once()
                except ApiError as err:
                    # On a real API server another writer (the backend, a test) may change or
                    # delete an object between the simulator's read and its write: a
                    # controller reads again, as this pass does.
                    if err.code not in (404, 409):
                        raise
                    continue
                if self.store.resource_version() == before:
                    return
        raise AssertionError("cluster simulator did not converge")

    def start(self) -> Self:
        """Settle in a background thread after every change to the store."""
        self.store.add_listener(self._wake.set)
        self._thread = threading.Thread(target=self._loop, name="cluster-simulator", daemon=True)
        self._thread.start()
        self._wake.set()
        return self

    def stop(self) -> None:
        """Stop the background thread (if started)."""
        if self._thread is None:
            return
        self._stopping.set()
        self._wake.set()
        self._thread.join(30)
        with contextlib.suppress(ValueError):
            self.store.remove_listener(self._wake.set)
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.settle()
            except Exception as err:  # kept for the test to assert on; the loop goes on
                self.errors.append(err)
            # A change that arrived while settling is not cleared: on a real API server its
            # watch event may be the only word of it (the next pass settles it, or finds
            # nothing to do).

    # -- reads ----------------------------------------------------------------------------------

    def trainjob(self, namespace: str, name: str) -> JsonObject:
        """The TrainJob (raises ApiError 404 when gone)."""
        return self.store.get(TRAINJOBS, namespace, name)

    def jobset(self, namespace: str, name: str) -> JsonObject | None:
        """The TrainJob's JobSet, if any."""
        return self.store.find(JOBSETS, namespace, name)

    def jobs(self, namespace: str, name: str) -> list[JsonObject]:
        """The TrainJob's child Jobs."""
        items, _, _ = self.store.list_objects(
            JOBS, namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}"
        )
        return items

    def pods(self, namespace: str, name: str) -> list[JsonObject]:
        """The TrainJob's pods, by completion index."""
        items, _, _ = self.store.list_objects(
            PODS, namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}"
        )
        return sorted(items, key=lambda p: int(_pod_index(p)))

    def workload(self, namespace: str, name: str) -> JsonObject | None:
        """The Kueue Workload of a queued TrainJob, if any."""
        items, _, _ = self.store.list_objects(WORKLOADS, namespace)
        tj = self.store.find(TRAINJOBS, namespace, name)
        return next((w for w in items if tj is not None and _owned_by(w, tj)), None)

    def nodes_of(self, namespace: str, name: str) -> list[str]:
        """Names of the nodes the TrainJob's pods are bound to."""
        return sorted(
            {p["spec"]["nodeName"] for p in self.pods(namespace, name) if p["spec"].get("nodeName")}
        )

    # -- nodes ----------------------------------------------------------------------------------

    def add_node(self, name: str) -> JsonObject:
        """Create a Ready node (as its kubelet would register it)."""
        now = format_time(self.store.now())
        endpoint: JsonObject = {}
        if self.kubelet is not None:
            endpoint = {
                "addresses": [
                    {"type": "InternalIP", "address": self.kubelet.host},
                    {"type": "Hostname", "address": name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet.port}},
            }
        obj, _ = self.store.create(
            NODES,
            None,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "spec": {},
                "status": {
                    **endpoint,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                },
            },
        )
        return obj

    def _node_ready(self, name: str | None) -> bool:
        node = self.store.find(NODES, None, name) if name else None
        return node is not None and _is_true(node, "Ready")

    def lose_node(self, node: str, *, evict: bool = True) -> None:
        """The node stops reporting: ``Ready=Unknown`` and the ``unreachable`` taints (facts B5).

        Without ``evict`` (inside the 300 s toleration) the pods stay Running on the dead node and
        the TrainJob's ``jobsStatus[].active`` stays 1. With ``evict`` (the toleration has
        passed), the taint manager marks each pod on it ``DisruptionTarget`` /
        ``DeletionByTaintManager`` and deletes it; with no kubelet to confirm, the pods stay
        Terminating (phase Running), their Job gets ``FailureTarget`` but never ``Failed``, and
        the TrainJob gets no terminal condition: the known hang.

        Note: the Job's ``status.active`` does not count terminating pods (facts B3 defines
        ``status.terminating`` for them), and the Job controller deletes the Job's other pods at
        ``FailureTarget``; so after eviction ``jobsStatus[].active`` is 0 here, not "> 0" as the
        facts file's B5 summary says. The TrainJob is still neither finished nor suspended.
        """
        with self.store.lock:
            obj = self.store.get(NODES, None, node)
            now = format_time(self.store.now())
            _set_condition(
                obj,
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                },
            )
            self.store.update(NODES, None, node, obj, subresource="status")
            obj = self.store.get(NODES, None, node)
            taints = [
                t for t in obj["spec"].get("taints") or () if t.get("key") != UNREACHABLE_TAINT
            ]
            for effect in ("NoSchedule", "NoExecute"):
                taints.append({"key": UNREACHABLE_TAINT, "effect": effect, "timeAdded": now})
            obj["spec"]["taints"] = taints
            self.store.update(NODES, None, node, obj)
            for pod in self._pods_on(node):
                _set_condition(pod, _pod_condition("Ready", "False", "NodeLost", "", now))
                self.store.update(
                    PODS,
                    pod["metadata"]["namespace"],
                    pod["metadata"]["name"],
                    pod,
                    subresource="status",
                )
            if evict:
                for pod in self._pods_on(node):
                    self._disrupt(
                        pod,
                        "DeletionByTaintManager",
                        "Taint manager: deleting due to NoExecute taint",
                    )
            self.settle()

    def restore_node(self, node: str) -> None:
        """The node comes back Ready; its kubelet confirms the deletions that were pending."""
        with self.store.lock:
            obj = self.store.get(NODES, None, node)
            now = format_time(self.store.now())
            _set_condition(
                obj,
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                },
            )
            self.store.update(NODES, None, node, obj, subresource="status")
            obj = self.store.get(NODES, None, node)
            obj["spec"]["taints"] = [
                t for t in obj["spec"].get("taints") or () if t.get("key") != UNREACHABLE_TAINT
            ]
            if not obj["spec"]["taints"]:
                del obj["spec"]["taints"]
            self.store.update(NODES, None, node, obj)
            self.settle()

    def delete_node(self, node: str) -> None:
        """Delete the Node object: PodGC marks its pods ``DeletionByPodGC`` and Failed, then
        force-deletes
        them (facts B3, ``gcOrphaned``)."""
        with self.store.lock:
            self.store.delete(NODES, None, node)
            now = format_time(self.store.now())
            for pod in self._pods_on(node):
                ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                _set_condition(
                    pod,
                    _pod_condition(
                        "DisruptionTarget",
                        "True",
                        "DeletionByPodGC",
                        "PodGC: node no longer exists",
                        now,
                    ),
                )
                pod["status"]["phase"] = "Failed"
                self.store.update(PODS, ns, name, pod, subresource="status")
                self.store.delete(PODS, ns, name, grace_period_seconds=0)
            self.settle()

    def shut_down_node(
        self, node: str, *, disruption_condition: bool = True, gone: bool = False
    ) -> None:
        """A graceful shutdown of the node (a spot or preemptible node reclaimed), as the
        kubelet's shutdown manager does it (kubernetes/kubernetes
        ``pkg/kubelet/nodeshutdown/nodeshutdown_manager.go``, ``killPods``): its Ready
        condition turns ``False`` with the shutdown manager's error ``node is shutting down``
        (``ShutdownStatus``), and each of its pods gets phase ``Failed``, ``status.reason``
        ``Terminated``, ``status.message`` "Pod was terminated in response to imminent node
        shutdown.", its containers SIGTERMed (exit 143), and, with ``disruption_condition``
        (a kubelet with ``PodDisruptionConditions``), ``DisruptionTarget`` /
        ``TerminationByKubelet`` with the same message. With ``gone`` the Node object is then
        deleted (the cloud provider removed the instance) before the Job controller reacts.
        """
        message = "Pod was terminated in response to imminent node shutdown."
        with self.store.lock:
            self.settle()
            obj = self.store.get(NODES, None, node)
            now = format_time(self.store.now())
            _set_condition(
                obj,
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "KubeletNotReady",
                    "message": "node is shutting down",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                },
            )
            self.store.update(NODES, None, node, obj, subresource="status")
            for pod in self._pods_on(node):
                if pod["status"].get("phase") in ("Succeeded", "Failed"):
                    continue
                pod["status"]["reason"] = "Terminated"
                pod["status"]["message"] = message
                if disruption_condition:
                    _set_condition(
                        pod,
                        _pod_condition(
                            "DisruptionTarget", "True", "TerminationByKubelet", message, now
                        ),
                    )
                self._terminate(pod, 143, "Error")
            if gone:
                self.store.delete(NODES, None, node)
            self.settle()

    def write_log(self, namespace: str, name: str, data: bytes, *, index: int = 0) -> str:
        """The trainer container of TrainJob ``name``'s pod ``index`` (the newest one: of the
        latest JobSet restart) prints ``data`` on its node (the fake kubelet); returns the
        pod's name.

        Raises:
            ValueError: no kubelet, or no such pod has run.
        """
        if self.kubelet is None:
            raise ValueError("the simulator was made without a kubelet")
        pods = [
            p
            for p in self.pods(namespace, name)
            if _pod_index(p) == str(index) and p["status"].get("phase") not in (None, "Pending")
        ]
        if not pods:
            raise ValueError(f"TrainJob {namespace}/{name} has no pod {index} that ran")
        pod = max(pods, key=lambda p: p["metadata"]["creationTimestamp"])
        self.kubelet.write(namespace, pod["metadata"]["name"], data, container=REPLICATED_JOB)
        return str(pod["metadata"]["name"])

    def _pods_on(self, node: str) -> list[JsonObject]:
        items, _, _ = self.store.list_objects(PODS, None, field_selector=f"spec.nodeName={node}")
        return items

    # -- scenario steps -------------------------------------------------------------------------

    def succeed(self, namespace: str, name: str) -> None:
        """Every pod exits 0: Job ``Complete``, JobSet ``Completed``/``AllJobsCompleted``, TrainJob
        ``Complete`` with the JobSet's reason (facts B1, B2)."""
        with self.store.lock:
            self.settle()
            for pod in self._live_pods(namespace, name):
                self._terminate(pod, 0, "Completed")
            self.settle()

    def fail(
        self,
        namespace: str,
        name: str,
        *,
        exit_code: int = 1,
        index: int = 0,
        reason: str = "Error",
    ) -> None:
        """The container of pod ``index`` exits with ``exit_code``: the Job fails with
        ``BackoffLimitExceeded`` (after its other pods are gone), the JobSet with ``FailedJobs``
        (no failurePolicy), and the TrainJob ``Failed`` copies the JobSet's reason and message
        (facts B1-B3)."""
        with self.store.lock:
            self.settle()
            pod = self._pod(namespace, name, index)
            self._terminate(pod, exit_code, reason)
            self.settle()

    def oom_kill(self, namespace: str, name: str, *, index: int = 0) -> None:
        """The container of pod ``index`` is OOM-killed: ``exitCode: 137``, ``reason: OOMKilled``
        (facts B3)."""
        self.fail(namespace, name, exit_code=137, index=index, reason="OOMKilled")

    def exceed_deadline(self, namespace: str, name: str) -> None:
        """``activeDeadlineSeconds`` expires: TrainJob ``Failed``/``DeadlineExceeded`` and the
        Trainer deletes the JobSet (facts B1, ``reconcileDeadline``)."""
        with self.store.lock:
            self.settle()
            tj = self.trainjob(namespace, name)
            now = format_time(self.store.now())
            _set_condition(
                tj,
                _condition_v1(
                    "Failed",
                    "True",
                    "DeadlineExceeded",
                    "TrainJob exceeded its active deadline",
                    now,
                    tj,
                ),
            )
            self.store.update(TRAINJOBS, namespace, name, tj, subresource="status")
            if self.jobset(namespace, name) is not None:
                self.store.delete(JOBSETS, namespace, name, propagation_policy="Foreground")
            self.settle()

    def preempt_by_scheduler(self, namespace: str, name: str, *, index: int = 0) -> None:
        """The scheduler preempts pod ``index``: ``DisruptionTarget``/``PreemptionByScheduler``,
        then deletion; the kubelet kills it (``Failed``) and the Job fails (facts B3)."""
        with self.store.lock:
            self.settle()
            pod = self._pod(namespace, name, index)
            self._disrupt(
                pod,
                "PreemptionByScheduler",
                f"{self._scheduler_name()}: preempting to accommodate a higher priority pod",
            )
            self.settle()

    def kueue_evict(
        self,
        namespace: str,
        name: str,
        *,
        reason: str = "Preempted",
        preemption_reason: str | None = "InClusterQueue",
        message: str = (
            "Preempted to accommodate a workload (UID: 4c6f6a3e) due to prioritization in the "
            "ClusterQueue"
        ),
    ) -> None:
        """Kueue evicts the TrainJob's Workload: ``Evicted`` (``reason``), plus ``Preempted``
        (``preemption_reason``) for a preemption; quota released; the TrainJob is suspended and its
        pods go **without** any pod-level reason (facts B4). Kueue then holds it until
        :meth:`admit`."""
        with self.store.lock:
            self.settle()
            wl = self.workload(namespace, name)
            if wl is None:
                raise ValueError(
                    f"TrainJob {namespace}/{name} has no Kueue Workload "
                    f"(no {QUEUE_NAME_LABEL} label)"
                )
            now = format_time(self.store.now())
            _set_condition(wl, _condition_v1("Evicted", "True", reason, message, now, wl))
            if preemption_reason is not None:
                _set_condition(
                    wl, _condition_v1("Preempted", "True", preemption_reason, message, now, wl)
                )
            _set_condition(wl, _condition_v1("QuotaReserved", "False", "Pending", message, now, wl))
            _set_condition(
                wl,
                _condition_v1(
                    "Admitted", "False", "NoReservation", "The workload has no reservation", now, wl
                ),
            )
            wl["status"].pop("admission", None)
            self.store.update(
                WORKLOADS, namespace, wl["metadata"]["name"], wl, subresource="status"
            )
            self.held.add((namespace, name))
            tj = self.trainjob(namespace, name)
            tj["spec"]["suspend"] = True
            self.store.update(TRAINJOBS, namespace, name, tj)
            self.settle()

    def admit(self, namespace: str, name: str) -> None:
        """Let Kueue admit a held TrainJob (quota became available)."""
        with self.store.lock:
            self.held.discard((namespace, name))
            self.settle()

    def fail_with_reason(self, namespace: str, name: str, *, reason: str, message: str) -> None:
        """The JobSet fails with a reason nobody mapped (a newer JobSet, say); the TrainJob copies
        it verbatim (facts B1: the Trainer keeps the JobSet's reason and message)."""
        with self.store.lock:
            self.settle()
            js = self.jobset(namespace, name)
            if js is None:
                raise ValueError(f"TrainJob {namespace}/{name} has no JobSet")
            now = format_time(self.store.now())
            _set_condition(js, _condition_v1("Failed", "True", reason, message, now, js))
            js["status"]["terminalState"] = "Failed"
            self.store.update(JOBSETS, namespace, name, js, subresource="status")
            self.settle()

    def expire_finished_jobset(self, namespace: str, name: str) -> None:
        """Delete the finished TrainJob's JobSet, as ``ttlSecondsAfterFinished`` would.

        With ``trainer_version="v2.3.0"`` the Trainer then removes ``Failed`` (unless its reason is
        ``DeadlineExceeded``) and re-creates the JobSet with a fresh restart budget: the TrainJob
        stops looking finished (facts B1, kubeflow/trainer #3779). On ``main`` it stays Failed.
        """
        with self.store.lock:
            self.store.delete(JOBSETS, namespace, name, propagation_policy="Background")
            self.settle()

    # -- scenario helpers -----------------------------------------------------------------------

    def _scheduler_name(self) -> str:
        return "default-scheduler"

    def _live_pods(self, namespace: str, name: str) -> list[JsonObject]:
        return [
            p
            for p in self.pods(namespace, name)
            if not p["metadata"].get("deletionTimestamp")
            and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]

    def _pod(self, namespace: str, name: str, index: int) -> JsonObject:
        for pod in self._live_pods(namespace, name):
            if _pod_index(pod) == str(index):
                return pod
        raise ValueError(f"TrainJob {namespace}/{name} has no running pod with index {index}")

    def _terminate(self, pod: JsonObject, exit_code: int, reason: str) -> None:
        now = format_time(self.store.now())
        status = pod["status"]
        started = status.get("startTime", now)
        status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        status["containerStatuses"] = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "startedAt": started,
                        "finishedAt": now,
                        "containerID": f"containerd://{pod['metadata']['uid'][:12]}",
                    }
                },
            }
            for c in pod["spec"]["containers"]
        ]
        _set_condition(pod, _pod_condition("Ready", "False", "PodCompleted", "", now))
        self.store.update(
            PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], pod, subresource="status"
        )
        if self.kubelet is not None:
            self.kubelet.exit(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _disrupt(self, pod: JsonObject, reason: str, message: str) -> None:
        now = format_time(self.store.now())
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        pod = self.store.get(PODS, ns, name)
        _set_condition(pod, _pod_condition("DisruptionTarget", "True", reason, message, now))
        self.store.update(PODS, ns, name, pod, subresource="status")
        self.store.delete(PODS, ns, name)

    # -- Kueue webhooks -------------------------------------------------------------------------

    def kueue_webhook(
        self, operation: str, obj: JsonObject, old: JsonObject | None
    ) -> list[JsonObject]:
        """Kueue's TrainJob webhooks as one real admission webhook answers
        (``tests/servers/kube_webhook.py``, CREATE and UPDATE): the validating one's refusal
        raised as :class:`AdmissionDenied`, the defaulting one's change as a JSON patch."""
        try:
            self._kueue_webhook_validate(operation, TRAINJOBS, obj, old)
        except ApiError as err:
            raise AdmissionDenied(err.code, err.message) from err
        after = self._kueue_webhook_default(operation, TRAINJOBS, copy.deepcopy(obj), old)
        if after.get("spec") == obj.get("spec"):
            return []
        return [{"op": "add", "path": "/spec", "value": after["spec"]}]

    def _kueue_webhook_default(
        self, op: str, rt: ResourceType, obj: JsonObject, old: JsonObject | None
    ) -> JsonObject:
        """Kueue's mutating webhook: a queued TrainJob is created suspended (facts B4)."""
        if (
            rt == TRAINJOBS
            and op == "CREATE"
            and QUEUE_NAME_LABEL in (obj["metadata"].get("labels") or {})
        ):
            obj.setdefault("spec", {})["suspend"] = True
        return obj

    def _kueue_webhook_validate(
        self, op: str, rt: ResourceType, obj: JsonObject, old: JsonObject | None
    ) -> None:
        """Kueue's validating webhook: ``admission-gated-by`` is set at creation only; later gates
        can only be removed (facts B4, KEP 6915)."""
        if rt != TRAINJOBS or op != "UPDATE" or old is None or not self.kueue_admission_gated_by:
            return
        new_gates = _gates(obj)
        old_gates = _gates(old)
        added = [g for g in new_gates if g not in old_gates]
        if added:
            path = f"metadata.annotations[{ADMISSION_GATED_BY}]"
            body = f"Forbidden: gates can only be removed, not added: {', '.join(added)}"
            raise ApiError(
                422,
                "Invalid",
                f'admission webhook "vtrainjob.kb.io" denied the request: {path}: {body}',
                details={
                    "name": obj["metadata"]["name"],
                    "group": TRAINJOBS.group,
                    "kind": TRAINJOBS.kind,
                    "causes": [{"reason": "FieldValueForbidden", "message": body, "field": path}],
                },
            )

    # -- reconcile ------------------------------------------------------------------------------

    def _reconcile_once(self) -> None:
        collect_garbage = getattr(self.store, "collect_garbage", None)
        if collect_garbage is not None:  # a real API server has no garbage collector running
            collect_garbage()
        for tj in self._all(TRAINJOBS):
            self._kueue(tj)
        for tj in self._all(TRAINJOBS):
            self._trainer(tj)
        for js in self._all(JOBSETS):
            self._jobset(js)
        for job in self._all(JOBS):
            self._job(job)
        for pod in self._all(PODS):
            self._kubelet(pod)
        job_uids = {j["metadata"]["uid"] for j in self._all(JOBS)}
        for pod in self._all(PODS):
            owners = {r.get("uid") for r in pod["metadata"].get("ownerReferences") or ()}
            if _tracked(pod) and not owners & job_uids:
                self._remove_tracking_finalizer(pod)  # orphaned pods lose it too
        for job in self._all(JOBS):
            self._job_status(job)
        for js in self._all(JOBSETS):
            self._jobset_status(js)
        for tj in self._all(TRAINJOBS):
            self._trainer_status(tj)

    def _all(self, rt: ResourceType) -> Iterator[JsonObject]:
        items, _, _ = self.store.list_objects(rt)
        yield from items

    def _fresh(self, rt: ResourceType, obj: Mapping[str, Any]) -> JsonObject | None:
        return self.store.find(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])

    def _write_status(self, rt: ResourceType, obj: JsonObject) -> None:
        self.store.update(
            rt, obj["metadata"].get("namespace"), obj["metadata"]["name"], obj, subresource="status"
        )

    # Kueue (facts B4)

    def _kueue(self, tj: JsonObject) -> None:
        meta = tj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if QUEUE_NAME_LABEL not in (meta.get("labels") or {}) or meta.get("deletionTimestamp"):
            return
        if _is_true(tj, "Complete") or _is_true(tj, "Failed"):
            return
        wl = self.workload(ns, name)
        now = format_time(self.store.now())
        if wl is None:
            suffix = hashlib.sha1(meta["uid"].encode()).hexdigest()[:5]
            annotations = {}
            if self.kueue_admission_gated_by and _gates(tj):
                annotations[ADMISSION_GATED_BY] = ",".join(_gates(tj))
            wl, _ = self.store.create(
                WORKLOADS,
                ns,
                {
                    "apiVersion": WORKLOADS.api_version,
                    "kind": "Workload",
                    "metadata": {
                        "name": f"trainjob-{name}-{suffix}"[:63],
                        "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
                        **({"annotations": annotations} if annotations else {}),
                        "ownerReferences": [_owner_ref(tj, "TrainJob", TRAINJOBS.api_version)],
                    },
                    "spec": {
                        "queueName": meta["labels"][QUEUE_NAME_LABEL],
                        "podSets": [{"name": REPLICATED_JOB, "count": _num_nodes(tj)}],
                    },
                },
            )
        gates = _gates(tj) if self.kueue_admission_gated_by else []
        wl_gates = ",".join(gates)
        if (wl["metadata"].get("annotations") or {}).get(ADMISSION_GATED_BY, "") != wl_gates:
            annotations = dict(wl["metadata"].get("annotations") or {})
            if wl_gates:
                annotations[ADMISSION_GATED_BY] = wl_gates
            else:
                annotations.pop(ADMISSION_GATED_BY, None)
            wl["metadata"]["annotations"] = annotations
            wl, _ = self.store.update(WORKLOADS, ns, wl["metadata"]["name"], wl)
        admitted = _is_true(wl, "Admitted")
        if gates:
            if not admitted:
                self._set_wl(
                    wl,
                    "QuotaReserved",
                    "False",
                    "AdmissionGated",
                    f"Admission is gated by: {wl_gates}",
                    now,
                )
            return
        if admitted or (ns, name) in self.held:
            if not admitted:
                self._set_wl(
                    wl,
                    "QuotaReserved",
                    "False",
                    "Pending",
                    "couldn't assign flavors to pod set node: insufficient quota",
                    now,
                )
            return
        wl = self.store.get(WORKLOADS, ns, wl["metadata"]["name"])
        _set_condition(
            wl,
            _condition_v1(
                "QuotaReserved",
                "True",
                "QuotaReserved",
                "Quota reserved in ClusterQueue cluster-queue",
                now,
                wl,
            ),
        )
        _set_condition(
            wl, _condition_v1("Admitted", "True", "Admitted", "The workload is admitted", now, wl)
        )
        for kind in ("Evicted", "Preempted"):
            if _is_true(wl, kind):
                _set_condition(
                    wl,
                    _condition_v1(
                        kind, "False", "Readmitted", "The workload is admitted again", now, wl
                    ),
                )
        wl["status"]["admission"] = {
            "clusterQueue": "cluster-queue",
            "podSetAssignments": [{"name": REPLICATED_JOB, "count": _num_nodes(tj)}],
        }
        self._write_status(WORKLOADS, wl)
        tj = self.store.get(TRAINJOBS, ns, name)
        patches = [
            p for p in tj["spec"].get("runtimePatches") or () if p.get("manager") != KUEUE_MANAGER
        ]
        patches.append(
            {
                "manager": KUEUE_MANAGER,
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {
                                    "name": REPLICATED_JOB,
                                    "template": {
                                        "spec": {
                                            "template": {
                                                "metadata": {
                                                    "labels": {
                                                        "kueue.x-k8s.io/podset": REPLICATED_JOB
                                                    }
                                                },
                                            }
                                        }
                                    },
                                }
                            ]
                        }
                    }
                },
            }
        )
        tj["spec"]["runtimePatches"] = patches
        tj["spec"]["suspend"] = False
        self.store.update(TRAINJOBS, ns, name, tj)

    def _set_wl(
        self, wl: JsonObject, kind: str, status: str, reason: str, message: str, now: str
    ) -> None:
        wl = self.store.get(WORKLOADS, wl["metadata"]["namespace"], wl["metadata"]["name"])
        cond = _condition(wl, kind)
        if cond is not None and (cond["status"], cond["reason"], cond["message"]) == (
            status,
            reason,
            message,
        ):
            return
        _set_condition(wl, _condition_v1(kind, status, reason, message, now, wl))
        self._write_status(WORKLOADS, wl)

    # Trainer (facts B1)

    def _trainer(self, tj: JsonObject) -> None:
        meta = tj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if (
            meta.get("deletionTimestamp")
            or tj["spec"].get("managedBy", TRAINER_MANAGER) != TRAINER_MANAGER
        ):
            return
        js = self.jobset(ns, name)
        failed = _condition(tj, "Failed")
        if (
            self.trainer_version == "v2.3.0"
            and js is None
            and failed is not None
            and failed.get("status") == "True"
            and failed.get("reason") != "DeadlineExceeded"
        ):
            # removeFailedCondition (trainjob_controller.go @v2.3.0): the JobSet is gone, so the
            # TrainJob no longer looks finished and gets a fresh JobSet below (#3779).
            tj = self.store.get(TRAINJOBS, ns, name)
            tj["status"]["conditions"] = [c for c in _conditions(tj) if c.get("type") != "Failed"]
            self._write_status(TRAINJOBS, tj)
        elif _is_true(tj, "Complete") or _is_true(tj, "Failed"):
            return
        suspend = bool(tj["spec"].get("suspend"))
        if js is None:
            self.store.create(JOBSETS, ns, self._jobset_body(tj))
            return
        if bool(js["spec"].get("suspend")) != suspend:
            js["spec"]["suspend"] = suspend
            self.store.update(JOBSETS, ns, name, js)

    def _jobset_body(self, tj: JsonObject) -> JsonObject:
        trainer = tj["spec"].get("trainer") or {}
        container: JsonObject = {
            "name": REPLICATED_JOB,
            "image": trainer.get("image", "ghcr.io/kubeflow/trainer/torchrun:latest"),
        }
        for key in ("command", "args", "env"):
            if key in trainer:
                container[key] = copy.deepcopy(trainer[key])
        labels: dict[str, str] = {}
        annotations: dict[str, str] = {}
        for patch in tj["spec"].get("runtimePatches") or ():
            for rj in (
                patch.get("trainingRuntimeSpec", {})
                .get("template", {})
                .get("spec", {})
                .get("replicatedJobs")
                or ()
            ):
                if rj.get("name") != REPLICATED_JOB:
                    continue
                pod_template = rj.get("template", {}).get("spec", {}).get("template", {})
                labels.update(pod_template.get("metadata", {}).get("labels") or {})
                annotations.update(pod_template.get("metadata", {}).get("annotations") or {})
                for patched in pod_template.get("spec", {}).get("containers") or ():
                    if patched.get("name") == REPLICATED_JOB and patched.get("env"):
                        container["env"] = [
                            *container.get("env", []),
                            *copy.deepcopy(patched["env"]),
                        ]
        n = _num_nodes(tj)
        job_spec: JsonObject = {
            "parallelism": n,
            "completions": n,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {"containers": [container], "restartPolicy": "Never"},
            },
        }
        spec: JsonObject = {
            "replicatedJobs": [
                {"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job_spec}}
            ],
            "suspend": bool(tj["spec"].get("suspend")),
        }
        if self.max_restarts is not None:
            spec["failurePolicy"] = {"maxRestarts": self.max_restarts}
        return {
            "apiVersion": JOBSETS.api_version,
            "kind": "JobSet",
            "metadata": {
                "name": tj["metadata"]["name"],
                "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"},
                "ownerReferences": [_owner_ref(tj, "TrainJob", TRAINJOBS.api_version)],
            },
            "spec": spec,
        }

    def _trainer_status(self, tj: JsonObject) -> None:
        meta = tj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if tj["spec"].get("managedBy", TRAINER_MANAGER) != TRAINER_MANAGER:
            return
        now = format_time(self.store.now())
        new = copy.deepcopy(tj)
        status = new.setdefault("status", {})
        suspended = _condition(tj, "Suspended")
        if tj["spec"].get("suspend"):
            _set_condition(
                new,
                _condition_v1("Suspended", "True", "Suspended", "TrainJob is suspended", now, tj),
            )
        elif suspended is not None and suspended.get("status") == "True":
            _set_condition(
                new, _condition_v1("Suspended", "False", "Resumed", "TrainJob is resumed", now, tj)
            )
        js = self.jobset(ns, name)
        if js is not None and not (_is_true(tj, "Complete") or _is_true(tj, "Failed")):
            status["jobsStatus"] = copy.deepcopy(
                js.get("status", {}).get("replicatedJobsStatus") or []
            )
            for js_kind, tj_kind in (("Completed", "Complete"), ("Failed", "Failed")):
                cond = _condition(js, js_kind)
                if cond is not None and cond.get("status") == "True":
                    _set_condition(
                        new,
                        _condition_v1(
                            tj_kind,
                            "True",
                            cond.get("reason", ""),
                            cond.get("message", ""),
                            now,
                            tj,
                        ),
                    )
        # An empty status is no change (a TrainJob without one read as {}), and the CRD's
        # ``status: minProperties: 1`` makes the real server refuse it with a 422.
        if new != tj and new["status"]:
            self._write_status(TRAINJOBS, new)

    # JobSet (facts B2)

    def _jobset(self, js: JsonObject) -> None:
        meta = js["metadata"]
        if meta.get("deletionTimestamp") or js.get("status", {}).get("terminalState"):
            return
        ns, name = meta["namespace"], meta["name"]
        restarts = js.get("status", {}).get("restarts", 0)
        jobs = self.jobs(ns, name)
        suspend = bool(js["spec"].get("suspend"))
        for rj in js["spec"]["replicatedJobs"]:
            for index in range(rj.get("replicas", 1)):
                job_name = f"{name}-{rj['name']}-{index}"
                current = next((j for j in jobs if j["metadata"]["name"] == job_name), None)
                if current is None:
                    self.store.create(JOBS, ns, self._job_body(js, rj, index, restarts))
                elif bool(current["spec"].get("suspend")) != suspend and not current[
                    "metadata"
                ].get("deletionTimestamp"):
                    current["spec"]["suspend"] = suspend
                    self.store.update(JOBS, ns, job_name, current)

    def _job_body(
        self, js: JsonObject, rj: Mapping[str, Any], index: int, restarts: int
    ) -> JsonObject:
        name = js["metadata"]["name"]
        labels = {
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/jobset-uid": js["metadata"]["uid"],
            "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
            "jobset.sigs.k8s.io/replicatedjob-replicas": str(rj.get("replicas", 1)),
            "jobset.sigs.k8s.io/job-index": str(index),
            "jobset.sigs.k8s.io/job-global-index": str(index),
            "jobset.sigs.k8s.io/restart-attempt": str(restarts),
        }
        job_key = hashlib.sha1(
            f"{js['metadata']['namespace']}/{name}-{rj['name']}-{index}".encode()
        ).hexdigest()
        annotations = {**labels, "jobset.sigs.k8s.io/job-key": job_key}
        spec = copy.deepcopy(rj["template"]["spec"])
        spec["suspend"] = bool(js["spec"].get("suspend"))
        template_meta = spec["template"].setdefault("metadata", {})
        template_meta["labels"] = {**(template_meta.get("labels") or {}), **labels}
        template_meta["annotations"] = {**(template_meta.get("annotations") or {}), **annotations}
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"{name}-{rj['name']}-{index}",
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [_owner_ref(js, "JobSet", JOBSETS.api_version)],
            },
            "spec": spec,
        }

    def _jobset_status(self, js: JsonObject) -> None:
        meta = js["metadata"]
        ns, name = meta["namespace"], meta["name"]
        status = js.get("status", {})
        if status.get("terminalState"):
            return
        jobs = [j for j in self.jobs(ns, name) if _owned_by(j, js)]
        now = format_time(self.store.now())
        new = copy.deepcopy(js)
        new_status = new.setdefault("status", {})
        restarts = status.get("restarts", 0)
        current = [
            j
            for j in jobs
            if j["metadata"]["labels"].get("jobset.sigs.k8s.io/restart-attempt") == str(restarts)
        ]
        rj_status = []
        for rj in js["spec"]["replicatedJobs"]:
            mine = [
                j
                for j in current
                if j["metadata"]["labels"].get("jobset.sigs.k8s.io/replicatedjob-name")
                == rj["name"]
            ]
            rj_status.append(
                {
                    "name": rj["name"],
                    "ready": sum(1 for j in mine if _job_ready(j)),
                    "succeeded": sum(1 for j in mine if _is_true(j, "Complete")),
                    "failed": sum(1 for j in mine if _is_true(j, "Failed")),
                    "active": sum(1 for j in mine if j.get("status", {}).get("active", 0) > 0),
                    "suspended": sum(1 for j in mine if j["spec"].get("suspend")),
                }
            )
        new_status["replicatedJobsStatus"] = rj_status
        if js["spec"].get("suspend"):
            _set_condition(
                new,
                _condition_v1("Suspended", "True", "SuspendedJobs", "jobset is suspended", now, js),
            )
        elif _is_true(js, "Suspended"):
            _set_condition(
                new, _condition_v1("Suspended", "False", "ResumeJobs", "jobset is resumed", now, js)
            )
        failed_job = next((j for j in current if _is_true(j, "Failed")), None)
        expected = sum(rj.get("replicas", 1) for rj in js["spec"]["replicatedJobs"])
        if failed_job is not None:
            policy = js["spec"].get("failurePolicy")
            if policy is None:
                self._fail_jobset(
                    new,
                    "FailedJobs",
                    "jobset failed due to one or more job failures "
                    f"(first failed job: {failed_job['metadata']['name']})",
                    now,
                )
            elif restarts >= policy.get("maxRestarts", 0):
                self._fail_jobset(
                    new,
                    "ReachedMaxRestarts",
                    "jobset failed due to reaching max number of restarts",
                    now,
                )
            else:
                new_status["restarts"] = restarts + 1
                new_status["restartsCountTowardsMax"] = status.get("restartsCountTowardsMax", 0) + 1
                _set_condition(
                    new,
                    _condition_v1(
                        "RestartingJobSet",
                        "True",
                        "DefaultFailurePolicy",
                        "jobset is restarting",
                        now,
                        js,
                    ),
                )
                self._write_status(JOBSETS, new)
                for job in jobs:
                    if not job["metadata"].get("deletionTimestamp"):
                        self.store.delete(
                            JOBS, ns, job["metadata"]["name"], propagation_policy="Foreground"
                        )
                return
        elif current and len(current) == expected and all(_is_true(j, "Complete") for j in current):
            new_status["terminalState"] = "Completed"
            _set_condition(
                new,
                _condition_v1(
                    "Completed",
                    "True",
                    "AllJobsCompleted",
                    "jobset completed successfully",
                    now,
                    js,
                ),
            )
        if (
            _is_true(js, "RestartingJobSet")
            and len(current) == expected
            and new_status.get("terminalState") is None
        ):
            _set_condition(
                new,
                _condition_v1(
                    "RestartingJobSet", "False", "JobsReady", "jobset is running", now, js
                ),
            )
        if new != js:
            self._write_status(JOBSETS, new)

    @staticmethod
    def _fail_jobset(js: JsonObject, reason: str, message: str, now: str) -> None:
        js["status"]["terminalState"] = "Failed"
        _set_condition(js, _condition_v1("Failed", "True", reason, message, now, js))
        if _is_true(js, "RestartingJobSet"):
            _set_condition(
                js,
                _condition_v1(
                    "RestartingJobSet", "False", "JobSetFailed", "jobset failed", now, js
                ),
            )

    # Job controller (facts B3)

    def _job_pods(self, job: JsonObject) -> list[JsonObject]:
        items, _, _ = self.store.list_objects(
            PODS,
            job["metadata"]["namespace"],
            label_selector=f"batch.kubernetes.io/controller-uid={job['metadata']['uid']}",
        )
        return items

    def _job(self, job: JsonObject) -> None:
        meta = job["metadata"]
        ns = meta["namespace"]
        pods = self._job_pods(job)
        finished = (
            _is_true(job, "Complete") or _is_true(job, "Failed") or _is_true(job, "FailureTarget")
        )
        if job["spec"].get("suspend") or finished or meta.get("deletionTimestamp"):
            for pod in pods:
                if not pod["metadata"].get("deletionTimestamp") and pod["status"].get(
                    "phase"
                ) not in ("Succeeded", "Failed"):
                    self.store.delete(PODS, ns, pod["metadata"]["name"])
            return
        succeeded = {_pod_index(p) for p in pods if p["status"].get("phase") == "Succeeded"}
        live = {
            _pod_index(p)
            for p in pods
            if p["status"].get("phase") != "Succeeded"
            and not p["metadata"].get("deletionTimestamp")
            and p["status"].get("phase") != "Failed"
        }
        for index in range(job["spec"].get("completions", 1)):
            if str(index) in succeeded or str(index) in live:
                continue
            if any(_pod_index(p) == str(index) for p in pods):
                continue  # a failed pod: with backoffLimit 0 the Job fails rather than replaces it
            self.store.create(PODS, ns, self._pod_body(job, index))

    def _pod_body(self, job: JsonObject, index: int) -> JsonObject:
        meta = job["metadata"]
        template = copy.deepcopy(job["spec"]["template"])
        uid = meta["uid"]
        suffix = hashlib.sha1(f"{uid}/{index}".encode()).hexdigest()[:5]
        labels = {
            **(template.get("metadata", {}).get("labels") or {}),
            "batch.kubernetes.io/controller-uid": uid,
            "controller-uid": uid,
            "batch.kubernetes.io/job-name": meta["name"],
            "job-name": meta["name"],
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        annotations = {
            **(template.get("metadata", {}).get("annotations") or {}),
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        spec = template["spec"]
        spec["hostname"] = f"{meta['name']}-{index}"
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec["tolerations"] = [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": UNREACHABLE_TAINT,
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{index}-{suffix}",
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [_owner_ref(job, "Job", "batch/v1")],
                "finalizers": [JOB_TRACKING_FINALIZER],
            },
            "spec": spec,
        }

    def _job_status(self, job: JsonObject) -> None:
        pods = self._job_pods(job)
        if job["metadata"].get("deletionTimestamp"):
            # A Job being deleted is no longer synced, but its finished or deleted pods still
            # lose the tracking finalizer, so that the (foreground) deletion can complete.
            for pod in pods:
                if _tracked(pod) and (
                    pod["metadata"].get("deletionTimestamp")
                    or pod["status"].get("phase") in ("Succeeded", "Failed")
                ):
                    self._remove_tracking_finalizer(pod)
            return
        now = format_time(self.store.now())
        new = copy.deepcopy(job)
        status = new.setdefault("status", {})
        terminating = [
            p
            for p in pods
            if p["metadata"].get("deletionTimestamp")
            and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]
        active = [
            p
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and p["status"].get("phase") in ("Pending", "Running")
        ]
        # Pods carry the job-tracking finalizer: the Job controller counts each finished pod once,
        # then removes the finalizer (which lets a pod whose deletion was confirmed go away).
        # isPodFailed: with no podFailurePolicy, a deleted pod that did not succeed counts as
        # failed at once, even while it is still Terminating.
        for pod in pods:
            if not _tracked(pod):
                continue
            phase = pod["status"].get("phase")
            if phase == "Succeeded":
                status["succeeded"] = status.get("succeeded", 0) + 1
            elif phase == "Failed" or pod["metadata"].get("deletionTimestamp"):
                if not job["spec"].get("suspend"):  # pods removed by suspension are no failures
                    status["failed"] = status.get("failed", 0) + 1
            else:
                continue
            self._remove_tracking_finalizer(pod)
        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if _is_true(p, "Ready"))
        status["terminating"] = len(terminating)
        status.setdefault("succeeded", 0)
        status.setdefault("failed", 0)
        succeeded = status["succeeded"]
        if not job["spec"].get("suspend") and pods:
            status.setdefault("startTime", now)
        if job["spec"].get("suspend"):
            _set_condition(
                new, _pod_condition("Suspended", "True", "JobSuspended", "Job suspended", now)
            )
        elif _is_true(job, "Suspended"):
            _set_condition(
                new, _pod_condition("Suspended", "False", "JobResumed", "Job resumed", now)
            )
        all_terminal = not active and not terminating
        if not _is_true(job, "Failed") and not _is_true(job, "Complete"):
            if status["failed"] > job["spec"].get("backoffLimit", 6) or _is_true(
                job, "FailureTarget"
            ):
                msg = "Job has reached the specified backoff limit"
                if not _is_true(job, "FailureTarget"):
                    _set_condition(
                        new,
                        _pod_condition("FailureTarget", "True", "BackoffLimitExceeded", msg, now),
                    )
                if all_terminal:
                    _set_condition(
                        new, _pod_condition("Failed", "True", "BackoffLimitExceeded", msg, now)
                    )
            elif succeeded >= job["spec"].get("completions", 1):
                msg = "Reached expected number of succeeded pods"
                _set_condition(
                    new,
                    _pod_condition("SuccessCriteriaMet", "True", "CompletionsReached", msg, now),
                )
                if all_terminal:
                    _set_condition(
                        new, _pod_condition("Complete", "True", "CompletionsReached", msg, now)
                    )
                    status["completionTime"] = now
        if new != job:
            self._write_status(JOBS, new)

    def _remove_tracking_finalizer(self, pod: JsonObject) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        fresh = self.store.get(PODS, ns, name)
        rest = [f for f in fresh["metadata"].get("finalizers") or () if f != JOB_TRACKING_FINALIZER]
        fresh["metadata"]["finalizers"] = rest or None
        if not rest:
            del fresh["metadata"]["finalizers"]
        self.store.update(PODS, ns, name, fresh)

    # scheduler + kubelet

    def _kubelet(self, pod: JsonObject) -> None:
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        node = pod["spec"].get("nodeName")
        now = format_time(self.store.now())
        if meta.get("deletionTimestamp"):
            if node and self._node_ready(node):
                if pod["status"].get("phase") not in ("Succeeded", "Failed"):
                    self._terminate(pod, 143, "Error")  # SIGTERM at the end of the grace period
                self.store.delete(PODS, ns, name, grace_period_seconds=0)
                if self.kubelet is not None:
                    self.kubelet.forget(ns, name)
            return
        if not node:
            ready = sorted(
                n["metadata"]["name"]
                for n in self._all(NODES)
                if _is_true(n, "Ready") and not n["spec"].get("taints")
            )
            if not ready:
                return
            chosen = ready[self._next_node % len(ready)]
            self._next_node += 1
            pod["spec"]["nodeName"] = chosen
            self.store.update(PODS, ns, name, pod)
            return
        if pod["status"].get("phase") == "Pending" and self._node_ready(node):
            status = pod["status"]
            status["phase"] = "Running"
            status["hostIP"] = "10.0.0.1"
            status["podIP"] = f"10.1.0.{(self._next_node % 250) + 2}"
            status["startTime"] = now
            status["containerStatuses"] = [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": now}},
                }
                for c in pod["spec"]["containers"]
            ]
            for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
                _set_condition(pod, _pod_condition(kind, "True", "", "", now))
            if self.kubelet is not None:  # the containers start, then the kubelet says so
                self.kubelet.run(ns, name, [c["name"] for c in pod["spec"]["containers"]])
            self.store.update(PODS, ns, name, pod, subresource="status")


def _tracked(pod: Mapping[str, Any]) -> bool:
    return JOB_TRACKING_FINALIZER in (pod["metadata"].get("finalizers") or ())


def _pod_index(pod: Mapping[str, Any]) -> str:
    return str(
        pod["metadata"].get("labels", {}).get("batch.kubernetes.io/job-completion-index", "0")
    )


def _num_nodes(tj: Mapping[str, Any]) -> int:
    return int((tj["spec"].get("trainer") or {}).get("numNodes") or 1)


def _gates(obj: Mapping[str, Any]) -> list[str]:
    raw = (obj["metadata"].get("annotations") or {}).get(ADMISSION_GATED_BY, "")
    return [g.strip() for g in raw.split(",") if g.strip()]


def _job_ready(job: Mapping[str, Any]) -> bool:
    status = job.get("status", {})
    done = int(status.get("ready", 0)) + int(status.get("succeeded", 0))
    return done >= int(job["spec"].get("parallelism", 1))


def _set_condition(obj: JsonObject, condition: JsonObject) -> None:
    """Insert or replace a condition by type; keep lastTransitionTime if the status is unchanged."""
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    for n, old in enumerate(conditions):
        if old.get("type") == condition["type"]:
            if old.get("status") == condition["status"] and "lastTransitionTime" in old:
                condition = {**condition, "lastTransitionTime": old["lastTransitionTime"]}
            conditions[n] = condition
            return
    conditions.append(condition)


def _condition_v1(
    kind: str, status: str, reason: str, message: str, now: str, obj: Mapping[str, Any]
) -> JsonObject:
    """A ``metav1.Condition`` (TrainJob, JobSet, Workload)."""
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
        "observedGeneration": obj["metadata"].get("generation", 1),
    }


def _pod_condition(kind: str, status: str, reason: str, message: str, now: str) -> JsonObject:
    """A pod or Job condition (``lastProbeTime`` style)."""
    cond: JsonObject = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": now,
    }
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def train_job_body(
    name: str,
    *,
    num_nodes: int = 2,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    suspend: bool | None = None,
    env: Mapping[str, str] | None = None,
) -> JsonObject:
    """A minimal valid TrainJob (v2.3.0 schema) for tests, on the ``torch-distributed`` runtime."""
    metadata: JsonObject = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    trainer: JsonObject = {"image": "ghcr.io/example/train:1", "numNodes": num_nodes}
    if env:
        trainer["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec: JsonObject = {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer}
    if suspend is not None:
        spec["suspend"] = suspend
    return {
        "apiVersion": TRAINJOBS.api_version,
        "kind": TRAINJOBS.kind,
        "metadata": metadata,
        "spec": spec,
    }
