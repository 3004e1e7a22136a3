"""The kubeflow backend: dispatch's objects are Kubeflow Trainer TrainJobs (DESIGN.md section 7).

See the package docstring for the whole picture; this module is the I/O: the blocking
``kubernetes`` client is called through ``asyncio.to_thread`` bounded by a semaphore, and
the watches (:mod:`.watch`) run in threads of their own.

**Calls.** :meth:`KubeflowBackend.discover` makes one paged TrainJob list per namespace
(label selector ``dispatch.dev/job``), whatever the number of jobs: that is
``Snapshot.calls`` (plus the rare housekeeping writes it made). The JobSets, Jobs, pods,
Workloads (``kueue`` mode) of each namespace and the cluster's nodes come from standing
list-then-watch streams, one per resource and namespace (pods and Jobs by the JobSet's own
label ``jobset.sigs.k8s.io/jobset-name``, so a foreign TrainJob's pods are seen too), so a
poll never reads per job.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
import threading
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dispatch_backends.kubeflow.body import InvalidLaunch, namespace_of, trainjob_body
from dispatch_backends.kubeflow.causes import NodeFacts, PodFacts, node_facts, pod_facts
from dispatch_backends.kubeflow.gate import open_patch
from dispatch_backends.kubeflow.logs import log_chunk, trainer_pod
from dispatch_backends.kubeflow.names import (
    ANNOTATION_OBSERVED,
    JOBSET,
    JOBSET_NAME_LABEL,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_SUBMISSION,
    TRAINER,
    WORKLOAD,
    read_number,
    trainjob_name,
)
from dispatch_backends.kubeflow.objects import (
    Job,
    JobSet,
    Meta,
    Node,
    Pod,
    TrainJob,
    Workload,
    decode,
    parse_time,
)
from dispatch_backends.kubeflow.observe import (
    Housekeeping,
    Observed,
    encode_observed,
    observe,
)
from dispatch_backends.kubeflow.settings import GateMode, KubeflowSettings, kubeflow_declarations
from dispatch_backends.kubeflow.watch import Reflector
from dispatch_backends.kubeflow.watch import status_words as _status_words
from dispatch_backends.output import check_window
from dispatch_backends.protocol import (
    BackendError,
    CessationAnswer,
    LaunchRefusedError,
    LaunchUnknownError,
    OutputChunk,
    OutputNotFound,
    OutputStream,
    Snapshot,
    Unreachable,
)
from dispatch_core.state import Declarations, ObjectPhase, ObjectRef, ObservedObject
from dispatch_core.steps import Launch

__all__ = ["ForeignObjectError", "KubeflowBackend", "ObjectNotFound"]

log = logging.getLogger("dispatch_backends.kubeflow")

_JSON_PATCH: Final = "application/json-patch+json"
_MERGE_PATCH: Final = "application/merge-patch+json"
_OPEN_GATE_TRIES: Final = 5


class ForeignObjectError(BackendError):
    """The object's submission and attempt can't be read: it is foreign (seed 002) and
    dispatch never touches it."""

    def __init__(self, cluster: str, object_id: str) -> None:
        super().__init__(cluster, f"TrainJob {object_id} is foreign: dispatch never touches it")
        self.object_id = object_id


class ObjectNotFound(BackendError):
    """No TrainJob at that ref (never made, or gone)."""

    def __init__(self, cluster: str, object_id: str) -> None:
        super().__init__(cluster, f"no TrainJob {object_id}")
        self.object_id = object_id


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _status_reason(err: ApiException) -> str:
    try:
        body = json.loads(err.body or "{}")
    except (TypeError, ValueError):
        return ""
    return str(body.get("reason") or "") if isinstance(body, dict) else ""


class KubeflowBackend:
    """dispatch's objects as TrainJobs on one Kubernetes cluster (see the package docstring).

    Implements :class:`~dispatch_backends.protocol.Backend`,
    :class:`~dispatch_backends.protocol.CessationSignal` and
    :class:`~dispatch_backends.protocol.EmergencyStopper`. Call :meth:`aclose` (or use
    ``async with``) to stop its watch threads.
    """

    def __init__(
        self,
        cluster: str,
        settings: KubeflowSettings,
        api_client: Any,
        *,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        """Serve ``cluster`` through ``api_client``.

        Args:
            cluster: the cluster name (part of every ref).
            settings: the cluster's settings.
            api_client: a ``kubernetes.client.ApiClient``; the backend does not close it
                (:meth:`from_settings` makes one it does close).
            clock: the time (timezone-aware), for retention and cessation.
        """
        self._cluster = cluster
        self._settings = settings
        self._api_client = api_client
        self._owns_client = False
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._clock = clock
        self._semaphore = asyncio.Semaphore(settings.max_concurrency)
        self._lock = threading.Lock()
        self._evidence: dict[tuple[str, str], dict[str, PodFacts]] = defaultdict(dict)
        self._memory: dict[str, Observed] = {}
        self._ended: dict[ObjectRef, tuple[str, ObservedObject]] = {}
        """The last terminal state reported of each TrainJob (job id, what it showed), kept
        across polls so one deleted after it ended is still reported ended with its real
        cause while the observer expects it (issue 15, "gone is not ended")."""
        self._gaps: dict[str, tuple[datetime, str]] = {}
        self._waiting_since: dict[str, datetime] = {}
        self._reflectors: dict[tuple[str, str], Reflector[Any]] = {}
        self._watch_clients: list[Any] = []
        self._started = False
        self._closed = False

    @classmethod
    def from_settings(cls, cluster: str, settings: KubeflowSettings) -> KubeflowBackend:
        """Build the backend with a client from the kubeconfig (or the in-cluster service
        account, ``settings.in_cluster``).

        Raises:
            BackendError: the kubeconfig can't be loaded.
        """
        from kubernetes import config as k8s_config

        configuration = k8s.Configuration()
        try:
            if settings.in_cluster:
                k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            else:
                k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=settings.kubeconfig or None,
                    context=settings.context or None,
                    client_configuration=configuration,
                )
        except Exception as err:  # the loaders raise a variety of their own errors
            raise BackendError(cluster, f"cannot load the Kubernetes configuration: {err}") from err
        configuration.connection_pool_maxsize = settings.max_concurrency + 2
        backend = cls(cluster, settings, k8s.ApiClient(configuration))
        backend._owns_client = True
        return backend

    # -- the Backend protocol -------------------------------------------------------------

    @property
    def cluster(self) -> str:
        """The cluster name."""
        return self._cluster

    @property
    def settings(self) -> KubeflowSettings:
        """The backend's settings."""
        return self._settings

    def declarations(self) -> Declarations:
        """The node-loss window (``settings.node_loss_window_s``), no native recovery
        actions, a cessation signal and an emergency stop."""
        return kubeflow_declarations(self._settings)

    async def start(self, launch: Launch) -> ObjectRef:
        """Create the launch's TrainJob with its start gate closed (see :mod:`.body`).

        A second start of the same launch (a retry after a lost answer) finds the TrainJob
        it made and returns it.

        Credentials: a 403 Forbidden is a refusal (RBAC denies ``create`` on TrainJobs in
        the launch's namespace, or admission, such as an exceeded ResourceQuota, said no:
        the cluster answered about this launch, and retrying the same request gets the
        same answer until an administrator acts). A 401 Unauthorized is not: the API server
        did not get as far as the launch (the token expired or was rotated, which the
        client's refresh or a new kubeconfig cures), so it is :class:`Unreachable`, nothing
        was created and the launch is retried.

        Raises:
            LaunchRefusedError: the API server refused it (its ``Status`` words verbatim;
                403 Forbidden included), or the launch can't be a TrainJob here.
            LaunchUnknownError: the answer was lost after the request was sent.
            Unreachable: the API server could not be asked (nothing was created): no
                connection, 429, or 401 Unauthorized.
        """
        self._ensure_watching()
        try:
            namespace = namespace_of(launch, self._settings)
            body = trainjob_body(launch, self._settings, secrets.token_hex(4))
        except InvalidLaunch as err:
            raise LaunchRefusedError(self._cluster, str(err)) from err
        name = body["metadata"]["name"]
        group, version, plural = TRAINER
        try:
            await self._call(
                self._custom.create_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                body,
                field_validation="Strict",
                _request_timeout=self._settings.request_timeout_s,
            )
        except ApiException as err:
            if err.status == 409 and _status_reason(err) == "AlreadyExists":
                return await self._existing(launch, namespace, name, err)
            if err.status in (401, 429):
                # 401: authentication failed before anything was made (an expired or rotated
                # token); the cluster said nothing about the launch, so it is retried.
                raise Unreachable(
                    self._cluster, f"create {namespace}/{name}: {_status_words(err)}"
                ) from err
            if err.status is not None and 400 <= err.status < 500:
                raise LaunchRefusedError(self._cluster, _status_words(err)) from err
            raise LaunchUnknownError(
                self._cluster, f"create {namespace}/{name}: {_status_words(err)}"
            ) from err
        except urllib3.exceptions.HTTPError as err:
            if _not_sent(err):
                raise Unreachable(self._cluster, f"create {namespace}/{name}: {err}") from err
            raise LaunchUnknownError(self._cluster, f"create {namespace}/{name}: {err}") from err
        log.info(
            "kubeflow.trainjob.created",
            extra={"namespace": namespace, "trainjob": name, "job_id": launch.intent.job_id},
        )
        return self._ref(namespace, name)

    async def _existing(
        self, launch: Launch, namespace: str, name: str, err: ApiException
    ) -> ObjectRef:
        found = await self._get_trainjob(self._ref(namespace, name))
        labels = ((found or {}).get("metadata") or {}).get("labels") or {}
        if (
            labels.get(LABEL_JOB) == launch.intent.job_id
            and read_number(labels, LABEL_SUBMISSION) == launch.submission
            and read_number(labels, LABEL_ATTEMPT) == launch.attempt
        ):
            log.info("kubeflow.trainjob.exists", extra={"namespace": namespace, "trainjob": name})
            return self._ref(namespace, name)
        raise LaunchRefusedError(
            self._cluster, f"{_status_words(err)} (and it is not this launch's TrainJob)"
        ) from err

    async def open_gate(self, ref: ObjectRef) -> None:
        """Open dispatch's own gate of ``ref`` (see :mod:`.gate`); another gate is left alone.
        Opening an open gate does nothing.

        The patch's ``test`` op guards the gates read. When someone (Kueue, an admin) changed
        the TrainJob between the read and the patch, a real API server answers a bare ``422
        Invalid`` ("the server rejected our request due to an error in our request", no
        details: the words never say which op failed), or a 409: either is answered by reading
        again and patching again, at most ``_OPEN_GATE_TRIES`` times. A refusal that a new
        read can't explain (the TrainJob's resourceVersion did not change) is not retried.

        Raises:
            ObjectNotFound: no such TrainJob.
            ForeignObjectError: it is foreign.
            Unreachable: the API server could not be asked.
            BackendError: the patch was refused for another reason, or the gates kept
                changing for every try.
        """
        namespace, name = self._split(ref)
        last_rv: str | None = None
        last_error: ApiException | None = None
        for _ in range(_OPEN_GATE_TRIES):
            trainjob = await self._own(ref)
            rv = str((trainjob.get("metadata") or {}).get("resourceVersion") or "")
            if last_error is not None and rv == last_rv:
                # nothing changed since the refused patch: the refusal is not a race
                raise self._error(f"open the gate of {ref.id}", last_error) from last_error
            last_rv = rv
            patch = open_patch(trainjob, self._settings.gate, self._settings.gate_name)
            if patch is None:
                return
            try:
                await self._patch(TRAINER, namespace, name, patch, _JSON_PATCH)
            except ApiException as err:
                if err.status in (409, 422):
                    last_error = err  # the gates (or the object) changed since read: read again
                    log.info(
                        "kubeflow.gate.retry",
                        extra={
                            "namespace": namespace,
                            "trainjob": name,
                            "status": err.status,
                            "error": _status_words(err),
                        },
                    )
                    continue
                raise self._error(f"open the gate of {ref.id}", err) from err
            log.info("kubeflow.gate.opened", extra={"namespace": namespace, "trainjob": name})
            return
        words = f": {_status_words(last_error)}" if last_error is not None else ""
        raise BackendError(
            self._cluster,
            f"open the gate of {ref.id}: its gates kept changing ({_OPEN_GATE_TRIES} tries){words}",
        )

    async def stop(self, ref: ObjectRef) -> None:
        """Delete ``ref`` with ``propagationPolicy: Foreground``: the TrainJob stays (phase
        ``stopping``) until its JobSet, Jobs and pods are gone, so a replacement's gate opens
        only after the old pods are. With ``release_lost_pods``, its pods on a node NotReady
        (or gone) for at least the node-loss window are force-deleted, since no kubelet will
        ever confirm their deletion (facts B5). An object already gone is not an error.

        Raises:
            ForeignObjectError: it is foreign.
            Unreachable: the API server could not be asked.
        """
        trainjob = await self._own_or_none(ref)
        if trainjob is None:
            return
        await self._delete(ref, trainjob)
        if self._settings.release_lost_pods:
            await self._force_delete_pods(ref, only_lost=True)

    async def emergency_stop(self, ref: ObjectRef) -> None:
        """Delete ``ref`` (foreground) and force-delete every pod of it now (grace 0), those
        on a NotReady node included: no kill wait (seed 002).

        Raises:
            ForeignObjectError: it is foreign.
            Unreachable: the API server could not be asked.
        """
        trainjob = await self._own_or_none(ref)
        if trainjob is not None:
            await self._delete(ref, trainjob)
        await self._force_delete_pods(ref, only_lost=False)

    async def discover(self, expected: Collection[ObjectRef] = ()) -> Snapshot:
        """Every TrainJob labelled ``dispatch.dev/job`` in the configured namespaces.

        Gone is not ended (issue 15): the last terminal state reported of each TrainJob is
        kept; an ``expected`` TrainJob no longer listed (deleted after it ended, by a TTL
        or a person) is reported with that state and its real cause, and one never seen
        ended is listed in ``Snapshot.vanished``. The memory is this process's: across a
        restart the end survives in the observer, whose last Discovery already showed the
        TrainJob ended (and so no longer expects it); a TrainJob that ended and was deleted
        while no observer ran is vanished, its end ``unknown``.

        One TrainJob list per namespace, plus the watches' caches (see the module
        docstring); then the housekeeping writes that keep what it reports true (see
        :mod:`.observe`).

        Credentials refused (401 Unauthorized, 403 Forbidden) are a :class:`BackendError`,
        not :class:`Unreachable`: the API server answered, and what it said (its words are
        kept) needs a person, not a retry. Whether at the first discovery or later, when a
        watch's relist or re-watch is refused, discovery raises rather than report from
        watch caches that can no longer be refreshed: an unauthorised cluster changes no
        job's state (no object is reported gone or ended because of it). Discovery
        recovers by itself once the watches are allowed again.

        Raises:
            Unreachable: a list failed, or the watches could not list at all.
            BackendError: the API server refused the credentials (401) or the permission
                (403), for the TrainJob list or a watch; or a watched resource is missing
                (404, no CRD).
        """
        self._ensure_watching()
        await self._wait_synced()
        seen_at = self._clock()
        calls = 0
        trainjobs: list[dict[str, Any]] = []
        for namespace in self._settings.namespaces:
            items, pages = await self._list_trainjobs(namespace)
            trainjobs.extend(items)
            calls += pages
        objects: dict[str, list[ObservedObject]] = defaultdict(list)
        chores: list[tuple[Housekeeping, dict[str, Any], Observed, Workload | None]] = []
        index = self._index()
        live: set[str] = set()
        for trainjob in trainjobs:
            typed = decode(TrainJob, trainjob)
            meta = typed.metadata
            namespace, name, uid = meta.namespace, meta.name, meta.uid
            live.add(uid)
            jobset = index.jobsets.get((namespace, name))
            if jobset is not None and not jobset.metadata.owned_by(uid):
                jobset = None
            jobset_uid = jobset.metadata.uid if jobset is not None else ""
            jobs = [
                j
                for j in index.jobs.get((namespace, name), ())
                if not jobset_uid or j.metadata.owned_by(jobset_uid)
            ]
            workload = index.workloads.get(uid)
            with self._lock:
                pods = list(self._evidence.get((namespace, name), {}).values())
                memory = self._memory.get(uid)
            result = observe(
                typed,
                cluster=self._cluster,
                settings=self._settings,
                jobset=jobset,
                jobs=jobs,
                pods=pods,
                nodes=index.nodes,
                workload=workload,
                memory=memory,
                caught_up=functools.partial(self._caught_up, namespace, uid, seen_at),
                now=seen_at,
                evidence_note=self._gap_note(namespace, meta),
            )
            with self._lock:
                self._memory[uid] = result.memory
            if not result.waiting:
                self._waiting_since.pop(uid, None)
            else:
                log.debug(
                    "kubeflow.evidence.waiting", extra={"namespace": namespace, "trainjob": name}
                )
            objects[result.job_id].append(result.observed)
            if self._settings.record_on_object and not result.observed.foreign:
                chores.extend((c, trainjob, result.memory, workload) for c in result.housekeeping)
        self._prune(trainjobs, live)
        for chore, trainjob, memory, workload in chores:
            calls += await self._housekeep(chore, trainjob, memory, workload)
        vanished = self._remember_ends(objects, expected)
        return Snapshot(
            cluster=self._cluster,
            seen_at=seen_at,
            objects={job: tuple(objs) for job, objs in objects.items()},
            calls=calls,
            vanished=vanished,
        )

    def _remember_ends(
        self, objects: dict[str, list[ObservedObject]], expected: Collection[ObjectRef]
    ) -> tuple[ObjectRef, ...]:
        """Keep the last terminal state of each listed TrainJob; report an expected one no
        longer listed from it (added to ``objects``), or return it as vanished. Entries the
        observer neither sees listed nor expects any more are dropped (it remembers the end
        itself from then on)."""
        listed: set[ObjectRef] = set()
        for job_id, objs in objects.items():
            for obs in objs:
                listed.add(obs.ref)
                if obs.phase is ObjectPhase.ENDED and not obs.foreign:
                    self._ended[obs.ref] = (job_id, obs)
        vanished: list[ObjectRef] = []
        wanted = {r for r in expected if r.cluster == self._cluster}
        for ref in sorted(wanted - listed, key=str):
            kept = self._ended.get(ref)
            if kept is None:
                vanished.append(ref)
            else:
                objects[kept[0]].append(kept[1])
        for ref in [r for r in self._ended if r not in listed and r not in wanted]:
            del self._ended[ref]
        return tuple(vanished)

    async def cessation(self, ref: ObjectRef, nodes: tuple[str, ...]) -> CessationAnswer:
        """Whether ``ref``'s processes are gone (seed 004), from the nodes it ran on.

        Ceased when no pod of it is left unfinished in the API server and every node it ran
        on (``nodes`` and those dispatch saw its pods on) is Ready, or saw each of its pods
        there finish (a kubelet reported them ``Succeeded``/``Failed``). A node NotReady or
        gone is never "ceased": a partitioned node may still run the processes.

        Raises:
            Unreachable: the API server could not be asked.
        """
        self._ensure_watching()
        await self._wait_synced()
        namespace, name = self._split(ref)
        pods = await self._pods_of(namespace, name)
        index = self._index()
        with self._lock:
            seen = list(self._evidence.get((namespace, name), {}).values())
        for pod in pods:
            facts = pod_facts(None, decode(Pod, pod), deleted=False)
            if not facts.finished:
                where = f" on node {facts.node}" if facts.node else ""
                state = "being deleted" if facts.deleting else f"phase {facts.phase or 'unknown'}"
                return CessationAnswer(
                    ceased=False, detail=f"pod {facts.name} is still there ({state}){where}"
                )
        ran = {p.node for p in seen if p.node} | set(nodes)
        for node in sorted(ran):
            facts_node = index.nodes.get(node)
            if facts_node is not None and facts_node.is_ready:
                continue
            # A lost node is cleared only by its own kubelet having reported each pod of the
            # object there finished (PodGC's Failed on a node that is gone is not that).
            on_node = [p for p in seen if p.node == node]
            if on_node and all(_confirmed_finished(p) for p in on_node):
                continue
            words = (
                facts_node.words() if facts_node is not None else f"node {node} no longer exists"
            )
            return CessationAnswer(
                ceased=False,
                detail=f"{words}: processes there can't be confirmed gone",
            )
        return CessationAnswer(
            ceased=True,
            detail=(
                f"no pod of {ref.id} is left unfinished, and each node it ran on "
                f"({', '.join(sorted(ran)) or 'none'}) is Ready or reported its pods finished"
            ),
        )

    async def read_output(
        self, ref: ObjectRef, stream: OutputStream, offset: int, limit: int
    ) -> OutputChunk:
        """Read the log of ``ref``'s trainer node 0 (``read_namespaced_pod_log`` of the
        pod of replicated job ``trainer_job``, index 0, latest JobSet restart; container
        ``trainer_container``) from byte ``offset``, at most ``limit`` bytes (capped; see
        :mod:`.logs`). ``stream`` is not told apart: Kubernetes keeps one log of both.
        Live until the TrainJob has a ``Complete`` or ``Failed`` condition; before its
        trainer pod runs, the output is empty. The server reads the log from the pod's
        node's kubelet, which keeps it as long as the pod's container.

        Raises:
            OutputNotFound: no such TrainJob (never made, or deleted), or another cluster's;
                the TrainJob ended, or was suspended after its pods were seen running, and
                its trainer pod is gone (its log with it); the pod, or its log on the node,
                is gone (the server's 404).
            Unreachable: the API server could not answer, or the kubelet failed (5xx: the
                kubelet's words, as the server relays them).
            BackendError: it refused (the server's words, e.g. 403: RBAC lacks
                ``pods/log``).
            ValueError: a negative offset or limit.
        """
        del stream
        limit = check_window(offset, limit)
        try:
            namespace, name = self._split(ref)
        except BackendError as err:
            raise OutputNotFound(self._cluster, err.detail) from None
        found = await self._get_trainjob(ref)
        if found is None:
            raise OutputNotFound(self._cluster, f"no TrainJob {ref.id}")
        trainjob = decode(TrainJob, found)
        live = not trainjob.finished
        pod = trainer_pod(await self._pods_of(namespace, name), self._settings.trainer_job)
        phase = ((pod or {}).get("status") or {}).get("phase", "")
        if pod is None:
            with self._lock:
                ran = [
                    p.name
                    for p in self._evidence.get((namespace, name), {}).values()
                    if p.phase in ("Running", "Succeeded", "Failed")
                ]
            # Pods that ran and are gone (a TrainJob ended, or suspended: Kueue evicted it)
            # took their logs with them; a TrainJob never seen running (by this process's
            # watches) reads as pending, as does one between a JobSet restart's pods.
            if not live or (ran and trainjob.suspended):
                when = "has ended and its" if not live else "was suspended after it ran, and its"
                raise OutputNotFound(
                    self._cluster,
                    f"TrainJob {ref.id} {when} trainer node-0 pod is gone (deleted, and its "
                    "log with it)",
                )
        if pod is None or phase in ("", "Pending"):
            where = f"TrainJob {ref.id} (its trainer pod has not started)"
            return OutputChunk(data=b"", offset=offset, size=0, live=live, where=where)
        pod_name = str((pod.get("metadata") or {}).get("name"))
        asked = offset + limit + 1
        try:
            answer = await self._call(
                self._core.read_namespaced_pod_log,
                pod_name,
                namespace,
                container=self._settings.trainer_container,
                limit_bytes=asked,
                _preload_content=False,
                _request_timeout=self._settings.request_timeout_s,
            )
        except (ApiException, urllib3.exceptions.HTTPError) as err:
            what = f"read the log of pod {namespace}/{pod_name}"
            if isinstance(err, ApiException) and err.status == 404:
                raise OutputNotFound(
                    self._cluster,
                    f"{what} of TrainJob {ref.id}: gone (the pod, or its container's log on "
                    f"its node, no longer exists): {_status_words(err)}",
                ) from err
            raise self._error(what, err) from err
        data = bytes(answer.data)
        return log_chunk(
            data, offset, limit, asked=asked, live=live, where=f"pod {namespace}/{pod_name}"
        )

    async def aclose(self) -> None:
        """Stop the watch threads (and close the client :meth:`from_settings` made)."""
        if self._closed:
            return
        self._closed = True
        reflectors = list(self._reflectors.values())

        def stop_all() -> None:
            for reflector in reflectors:
                reflector.stop()
            for reflector in reflectors:
                reflector.join()
            for api in self._watch_clients:
                api.close()
            if self._owns_client:
                self._api_client.close()

        await asyncio.to_thread(stop_all)

    async def __aenter__(self) -> KubeflowBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- watches --------------------------------------------------------------------------

    def _ensure_watching(self) -> None:
        if self._started:
            return
        if self._closed:
            raise BackendError(self._cluster, "the backend is closed")
        self._started = True
        settings = self._settings
        for namespace in settings.namespaces:
            core, batch, custom = self._watch_apis()
            self._add(
                "pods",
                namespace,
                functools.partial(core.list_namespaced_pod, namespace),
                JOBSET_NAME_LABEL,
                Pod,
                on_object=functools.partial(self._on_pod, namespace, False),
                on_deleted=functools.partial(self._on_pod_deleted, namespace),
                on_relisted=functools.partial(self._on_relisted, namespace),
            )
            self._add(
                "jobs",
                namespace,
                functools.partial(batch.list_namespaced_job, namespace),
                JOBSET_NAME_LABEL,
                Job,
            )
            self._add("jobsets", namespace, _lister(custom, JOBSET, namespace), None, JobSet)
            if settings.gate is GateMode.KUEUE:
                _, _, custom2 = self._watch_apis()
                lister = _lister(custom2, WORKLOAD, namespace)
                self._add("workloads", namespace, lister, None, Workload)
        core, _, _ = self._watch_apis()
        self._add("nodes", "", core.list_node, None, Node)
        for reflector in self._reflectors.values():
            reflector.start()

    def _watch_apis(self) -> tuple[Any, Any, Any]:
        api = k8s.ApiClient(self._api_client.configuration)
        self._watch_clients.append(api)
        return k8s.CoreV1Api(api), k8s.BatchV1Api(api), k8s.CustomObjectsApi(api)

    def _add(
        self,
        kind: str,
        namespace: str,
        list_fn: Callable[..., Any],
        selector: str | None,
        decoded: type[msgspec.Struct],
        *,
        on_object: Callable[[Any], None] | None = None,
        on_deleted: Callable[[Any, bool], None] | None = None,
        on_relisted: Callable[[int], None] | None = None,
    ) -> None:
        self._reflectors[(kind, namespace)] = Reflector(
            f"{kind} {namespace}".strip(),
            list_fn,
            decode=functools.partial(decode, decoded),
            label_selector=selector,
            on_object=on_object or _ignore,
            on_deleted=on_deleted or _ignore_deleted,
            on_relisted=on_relisted,
            watch_timeout_s=self._settings.watch_timeout_s,
            request_timeout_s=self._settings.request_timeout_s,
        )

    def _on_pod(self, namespace: str, deleted: bool, pod: Pod) -> None:
        trainjob = pod.metadata.label(JOBSET_NAME_LABEL)
        if not trainjob:
            return
        with self._lock:
            pods = self._evidence[(namespace, trainjob)]
            pods[pod.metadata.uid] = pod_facts(pods.get(pod.metadata.uid), pod, deleted=deleted)

    def _on_pod_deleted(self, namespace: str, pod: Pod, seen: bool) -> None:
        self._on_pod(namespace, True, pod)
        if not seen:
            key = (namespace, pod.metadata.label(JOBSET_NAME_LABEL))
            with self._lock:
                facts = self._evidence.get(key, {}).get(pod.metadata.uid)
                if facts is not None:
                    self._evidence[key][pod.metadata.uid] = msgspec.structs.replace(
                        facts, lost=True
                    )

    def _on_relisted(self, namespace: str, rv: int) -> None:
        reflector = self._reflectors.get(("pods", namespace))
        if reflector is not None and reflector.lists > 1:
            now = self._clock()
            self._gaps[namespace] = (
                now,
                f"the pod watch of namespace {namespace} expired (410) and was relisted at "
                f"{now.isoformat(timespec='seconds')}: pod changes before that may not have "
                "been seen",
            )

    def _gap_note(self, namespace: str, meta: Meta) -> str:
        """The pod watch's last gap in ``namespace``, if the TrainJob existed then."""
        gap = self._gaps.get(namespace)
        created = parse_time(meta.creation_timestamp)
        if gap is None or (created is not None and created > gap[0]):
            return ""
        return gap[1]

    async def _wait_synced(self) -> None:
        """Wait for every watch's first list; then refuse to go on while a watch's
        credentials are refused (its cache can't be refreshed, so it must not be read as
        the cluster's present).

        Raises:
            BackendError: a watch can't list or watch for credentials (401/403), RBAC or a
                missing CRD (404).
            Unreachable: a watch could not list within ``sync_timeout_s`` otherwise.
        """
        reflectors = list(self._reflectors.values())
        if all(r.synced for r in reflectors):
            refused = [r for r in reflectors if r.error_status in (401, 403)]
            if refused:
                errors = "; ".join(f"{r.name}: {r.error}" for r in refused)
                raise BackendError(
                    self._cluster, f"the watches are refused (their caches are stale): {errors}"
                )
            return
        timeout = self._settings.sync_timeout_s

        def wait() -> bool:
            return all(r.wait_synced(timeout) for r in reflectors)

        if not await asyncio.to_thread(wait):
            failing = [r for r in reflectors if not r.synced]
            errors = "; ".join(f"{r.name}: {r.error}" for r in failing)
            if any(r.error_status in (401, 403, 404) for r in failing):
                # not an outage: credentials, RBAC or a missing CRD; the words say which
                raise BackendError(self._cluster, f"the watches can't list: {errors}")
            raise Unreachable(self._cluster, f"the watches could not list: {errors}")

    def _caught_up(self, namespace: str, uid: str, now: datetime, rv: int) -> bool:
        """Whether every watch of ``namespace`` (and of the nodes) has seen up to ``rv``.

        Progress on a quiet stream comes from bookmarks only (on a recent API server about
        once a minute and before a watch's timeout; none from 1.20); a decision that has waited
        ``evidence_wait_s`` for it goes ahead while every watch is healthy (its events
        arrive within moments, so by then it has them). A broken watch is never waited past.
        """
        relevant = [r for (_, ns), r in self._reflectors.items() if ns in (namespace, "")]
        if all(r.progress >= rv for r in relevant):
            return True
        since = self._waiting_since.setdefault(uid, now)
        waited = now - since >= timedelta(seconds=self._settings.evidence_wait_s)
        return waited and all(r.error is None for r in relevant)

    def _index(self) -> _Index:
        """What the watches hold now, indexed by owner."""
        index = _Index()
        for (_, namespace), reflector in self._reflectors.items():
            for obj in reflector.objects():
                match obj:
                    case JobSet():
                        index.jobsets[(namespace, obj.metadata.name)] = obj
                    case Job():
                        index.jobs[(namespace, obj.metadata.label(JOBSET_NAME_LABEL))].append(obj)
                    case Workload():
                        for ref in obj.metadata.owner_references or ():
                            if ref.kind == "TrainJob":
                                index.workloads[ref.uid] = obj
                    case Node():
                        facts = node_facts(obj)
                        index.nodes[facts.name] = facts
                    case _:
                        pass
        return index

    def _prune(self, trainjobs: list[dict[str, Any]], live: set[str]) -> None:
        names = {
            (str(t["metadata"].get("namespace")), str(t["metadata"].get("name"))) for t in trainjobs
        }
        with self._lock:
            for uid in [u for u in self._memory if u not in live]:
                del self._memory[uid]
            for uid in [u for u in self._waiting_since if u not in live]:
                del self._waiting_since[uid]
            for key in [k for k in self._evidence if k not in names]:
                if all(p.deleted for p in self._evidence[key].values()):
                    del self._evidence[key]

    # -- calls ----------------------------------------------------------------------------

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one blocking client call in a worker thread, at most ``max_concurrency`` at
        once. (Typed ``Any``: the generated client's annotations don't describe
        ``_preload_content=False`` answers.)"""
        async with self._semaphore:
            return await asyncio.to_thread(fn, *args, **kwargs)

    async def _patch(
        self,
        kind: tuple[str, str, str],
        namespace: str,
        name: str,
        body: object,
        content_type: str = _MERGE_PATCH,
    ) -> None:
        """Patch the custom object ``name`` of ``kind`` (``(group, version, plural)``, e.g.
        ``TRAINER``) in ``namespace`` with ``body``, a merge patch unless ``content_type``
        says otherwise; the client's errors are the caller's to translate."""
        group, version, plural = kind
        await self._call(
            self._custom.patch_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            body,
            _content_type=content_type,
            _request_timeout=self._settings.request_timeout_s,
        )

    def _error(self, what: str, err: ApiException | urllib3.exceptions.HTTPError) -> BackendError:
        """Translate a client error: unreachable when the server could not answer (no
        connection, 429, 5xx), else a non-retryable error with the server's words."""
        if isinstance(err, ApiException):
            if err.status in (None, 0, 429) or (err.status or 0) >= 500:
                return Unreachable(self._cluster, f"{what}: {_status_words(err)}")
            return BackendError(self._cluster, f"{what}: {_status_words(err)}")
        return Unreachable(self._cluster, f"{what}: {err}")

    async def _list_trainjobs(self, namespace: str) -> tuple[list[dict[str, Any]], int]:
        group, version, plural = TRAINER
        items: list[dict[str, Any]] = []
        token: str | None = None
        pages = 0
        while True:
            kwargs: dict[str, Any] = {"label_selector": LABEL_JOB, "limit": 500}
            if token:
                kwargs["_continue"] = token
            try:
                page = await self._call(
                    self._custom.list_namespaced_custom_object,
                    group,
                    version,
                    namespace,
                    plural,
                    _request_timeout=self._settings.request_timeout_s,
                    **kwargs,
                )
            except (ApiException, urllib3.exceptions.HTTPError) as err:
                raise self._error(f"list TrainJobs in {namespace}", err) from err
            pages += 1
            items.extend(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items, pages

    async def _get_trainjob(self, ref: ObjectRef) -> dict[str, Any] | None:
        namespace, name = self._split(ref)
        group, version, plural = TRAINER
        try:
            found: dict[str, Any] = await self._call(
                self._custom.get_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                name,
                _request_timeout=self._settings.request_timeout_s,
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise self._error(f"read TrainJob {ref.id}", err) from err
        except urllib3.exceptions.HTTPError as err:
            raise self._error(f"read TrainJob {ref.id}", err) from err
        return found

    async def _own(self, ref: ObjectRef) -> dict[str, Any]:
        found = await self._own_or_none(ref)
        if found is None:
            raise ObjectNotFound(self._cluster, ref.id)
        return found

    async def _own_or_none(self, ref: ObjectRef) -> dict[str, Any] | None:
        """The TrainJob at ``ref`` (``None`` when gone), refusing a foreign one."""
        found = await self._get_trainjob(ref)
        if found is None:
            return None
        labels = (found.get("metadata") or {}).get("labels") or {}
        if (
            not labels.get(LABEL_JOB)
            or read_number(labels, LABEL_SUBMISSION) is None
            or read_number(labels, LABEL_ATTEMPT) is None
        ):
            raise ForeignObjectError(self._cluster, ref.id)
        return found

    async def _delete(self, ref: ObjectRef, trainjob: Mapping[str, Any]) -> None:
        meta = trainjob.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return
        namespace, name = self._split(ref)
        group, version, plural = TRAINER
        body = k8s.V1DeleteOptions(
            propagation_policy="Foreground",
            preconditions=k8s.V1Preconditions(uid=meta.get("uid")),
        )
        try:
            await self._call(
                self._custom.delete_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                name,
                body=body,
                _request_timeout=self._settings.request_timeout_s,
            )
        except ApiException as err:
            if err.status in (404, 409):  # gone, or replaced by another object of that name
                return
            raise self._error(f"delete TrainJob {ref.id}", err) from err
        except urllib3.exceptions.HTTPError as err:
            raise self._error(f"delete TrainJob {ref.id}", err) from err
        log.info("kubeflow.trainjob.deleted", extra={"namespace": namespace, "trainjob": name})

    async def _pods_of(self, namespace: str, name: str) -> list[dict[str, Any]]:
        try:
            resp = await self._call(
                self._core.list_namespaced_pod,
                namespace,
                label_selector=f"{JOBSET_NAME_LABEL}={name}",
                _preload_content=False,
                _request_timeout=self._settings.request_timeout_s,
            )
        except (ApiException, urllib3.exceptions.HTTPError) as err:
            raise self._error(f"list the pods of {namespace}/{name}", err) from err
        return list(json.loads(resp.data).get("items") or ())

    async def _force_delete_pods(self, ref: ObjectRef, *, only_lost: bool) -> None:
        namespace, name = self._split(ref)
        pods = await self._pods_of(namespace, name)
        if not pods:
            return
        nodes = self._index().nodes if all(r.synced for r in self._reflectors.values()) else {}
        window = timedelta(seconds=self._settings.node_loss_window_s)
        now = self._clock()
        for pod in pods:
            meta = pod.get("metadata") or {}
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            if only_lost:
                facts = nodes.get(node)
                if not node or not nodes or (facts is not None and facts.is_ready):
                    continue
                if facts is not None and (facts.since is None or now - facts.since < window):
                    continue
            try:
                await self._call(
                    self._core.delete_namespaced_pod,
                    str(meta.get("name")),
                    namespace,
                    grace_period_seconds=0,
                    _request_timeout=self._settings.request_timeout_s,
                )
            except ApiException as err:
                if err.status == 404:
                    continue
                raise self._error(f"force-delete pod {namespace}/{meta.get('name')}", err) from err
            except urllib3.exceptions.HTTPError as err:
                raise self._error(f"force-delete pod {namespace}/{meta.get('name')}", err) from err
            log.warning(
                "kubeflow.pod.force_deleted",
                extra={"namespace": namespace, "pod": meta.get("name"), "node": node},
            )

    async def _housekeep(
        self,
        chore: Housekeeping,
        trainjob: Mapping[str, Any],
        memory: Observed,
        workload: Workload | None,
    ) -> int:
        """Make one housekeeping write; return the calls made. A failure is logged, never
        raised: the snapshot is already right, and the write is retried next time."""
        meta = trainjob.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        try:
            match chore:
                case Housekeeping.RECORD:
                    annotations = {ANNOTATION_OBSERVED: encode_observed(memory)}
                    await self._patch(
                        TRAINER, namespace, name, {"metadata": {"annotations": annotations}}
                    )
                case Housekeeping.SUSPEND:
                    await self._patch(TRAINER, namespace, name, {"spec": {"suspend": True}})
                    log.warning(
                        "kubeflow.trainjob.revived",
                        extra={"namespace": namespace, "trainjob": name},
                    )
                case Housekeeping.DEACTIVATE:
                    wl_name = workload.metadata.name if workload is not None else "None"
                    await self._patch(WORKLOAD, namespace, wl_name, {"spec": {"active": False}})
                    log.info(
                        "kubeflow.workload.deactivated",
                        extra={"namespace": namespace, "workload": wl_name, "trainjob": name},
                    )
                case Housekeeping.DELETE:
                    await self._delete(self._ref(namespace, name), trainjob)
                case _:
                    raise AssertionError(f"unhandled housekeeping {chore!r}")
        except (ApiException, urllib3.exceptions.HTTPError, BackendError) as err:
            log.warning(
                "kubeflow.housekeeping.failed",
                extra={
                    "namespace": namespace,
                    "trainjob": name,
                    "chore": str(chore),
                    "error": str(err),
                },
            )
        return 1

    # -- refs -----------------------------------------------------------------------------

    def _ref(self, namespace: str, name: str) -> ObjectRef:
        return ObjectRef(cluster=self._cluster, id=f"{namespace}/{name}")

    def _split(self, ref: ObjectRef) -> tuple[str, str]:
        if ref.cluster != self._cluster:
            raise BackendError(self._cluster, f"{ref} is not on this cluster")
        namespace, sep, name = ref.id.partition("/")
        if not sep or not namespace or not name:
            raise BackendError(self._cluster, f"{ref.id!r} is not <namespace>/<name>")
        return namespace, name

    def trainjob_name(self, launch: Launch) -> str:
        """The TrainJob name ``launch`` makes (see :func:`.names.trainjob_name`)."""
        return trainjob_name(launch.intent.job_id, launch.submission, launch.attempt)


class _Index:
    """The watches' objects by owner: JobSets by (namespace, name), Jobs by (namespace,
    JobSet name), Workloads by their TrainJob's uid, nodes by name."""

    def __init__(self) -> None:
        self.jobsets: dict[tuple[str, str], JobSet] = {}
        self.jobs: dict[tuple[str, str], list[Job]] = defaultdict(list)
        self.workloads: dict[str, Workload] = {}
        self.nodes: dict[str, NodeFacts] = {}


def _lister(custom: Any, kind: tuple[str, str, str], namespace: str) -> Callable[..., Any]:
    """The list call of the custom objects of ``kind`` (``(group, version, plural)``) in
    ``namespace``, on the ``CustomObjectsApi`` ``custom``, for a watch to call."""
    group, version, plural = kind
    list_fn = custom.list_namespaced_custom_object
    return functools.partial(list_fn, group, version, namespace, plural)


def _confirmed_finished(pod: PodFacts) -> bool:
    """Whether a kubelet reported ``pod`` finished: phase ``Succeeded``/``Failed`` seen, not
    lost in a watch gap, and not marked by the controllers that act for a dead node."""
    disruption = pod.disruption
    return (
        pod.finished
        and not pod.lost
        and (
            disruption is None
            or disruption.reason not in ("DeletionByPodGC", "DeletionByTaintManager")
        )
    )


def _not_sent(err: urllib3.exceptions.HTTPError) -> bool:
    """Whether a connection error happened before the request was sent (nothing made)."""
    reason = getattr(err, "reason", None)
    return isinstance(err, urllib3.exceptions.NewConnectionError) or isinstance(
        reason, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError
    )


def _ignore(obj: object) -> None:
    del obj


def _ignore_deleted(obj: object, seen: bool) -> None:
    del obj, seen
