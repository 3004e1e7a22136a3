"""The kubeflow backend's settings: one frozen struct, read from the clusters file.

Every duration is in seconds (``_s``). A launch's ``JobSpec.options`` may override the
per-launch ones (see :data:`OPTIONS`); everything else is the cluster's.
"""

from __future__ import annotations

import enum
from typing import Final

import msgspec

from dispatch_core.state import Declarations

__all__ = ["OPTIONS", "GateMode", "KubeflowSettings", "kubeflow_declarations"]


class GateMode(enum.StrEnum):
    """How the start gate is held (DESIGN.md section 7; facts file B4).

    ``kueue``: the TrainJob is created with Kueue's ``kueue.x-k8s.io/admission-gated-by``
    annotation naming dispatch's gate (and ``spec.suspend: true``, which Kueue's webhook sets
    anyway); opening removes only dispatch's gate, and Kueue admits it when quota allows.
    Needs Kueue >= v0.19 (``AdmissionGatedBy`` beta, on by default; alpha in v0.17) and a
    LocalQueue (``queue``).

    ``suspend``: for a cluster without Kueue; the TrainJob is created with
    ``spec.suspend: true`` and opening sets it to ``false``.
    """

    KUEUE = "kueue"
    SUSPEND = "suspend"


OPTIONS: Final = frozenset(
    {
        "namespace",
        "queue",
        "runtime",
        "runtime_kind",
        "image",
        "nodes",
        "procs_per_node",
        "gpus",
        "time",
        "priority_class",
        "cpu",
        "memory",
        "cpu_limit",
        "memory_limit",
        "tolerations",
        "node_selector",
        "checkpoint_pvc",
        "checkpoint_mount",
    }
)
"""``JobSpec.options`` the backend reads (others are ignored, so a spec written for another
backend still launches here): ``namespace`` (one of ``namespaces``), ``queue`` (Kueue
LocalQueue), ``runtime`` / ``runtime_kind`` (``spec.runtimeRef``), ``image``, ``nodes``
(``spec.trainer.numNodes``), ``procs_per_node`` (``numProcPerNode``), ``gpus``
(``resourcesPerNode`` limit ``nvidia.com/gpu``), ``time`` (``spec.activeDeadlineSeconds``, in
Slurm's ``--time`` format like the local backend: counted from creation or from the last
resume, so from the gate opening), ``priority_class`` (Kueue's
``kueue.x-k8s.io/priority-class`` label), ``cpu`` / ``memory`` (requests per node) and
``cpu_limit`` / ``memory_limit`` (limits per node; Kubernetes quantities such as ``4``,
``500m``, ``16Gi``), ``node_selector`` (``label=value,...``), ``tolerations``
(``key[=value][:effect],...``; ``=value`` is operator Equal, none Exists) and
``checkpoint_pvc`` / ``checkpoint_mount`` (a PersistentVolumeClaim mounted in the trainer
container, at ``/checkpoints`` by default: the checkpoint root).

A submission is checked against them (:func:`dispatch_backends.kubeflow.body.check_options`,
through :func:`dispatch_backends.check_options`): a value a launch would refuse (a
``namespace`` not in ``namespaces``, ``nodes`` / ``procs_per_node`` / ``gpus`` not a whole
number >= 1, a ``time`` not in Slurm's format, no ``queue`` in ``kueue`` mode when the
settings have none) is refused with a 400 naming ``spec.options.<key>``."""


class KubeflowSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Settings of one Kubeflow Trainer cluster.

    Attributes:
        namespaces: namespaces dispatch launches into and discovers (one list and one set of
            watches each); launches go to the first unless ``options["namespace"]`` names
            another of them.
        gate: how the start gate is held (:class:`GateMode`).
        gate_name: dispatch's own gate in ``kueue.x-k8s.io/admission-gated-by``.
        queue: the Kueue LocalQueue (``kueue.x-k8s.io/queue-name``) when ``options`` has none;
            required in ``kueue`` mode.
        runtime: ``spec.runtimeRef.name`` when ``options`` has none.
        runtime_kind: ``ClusterTrainingRuntime`` or ``TrainingRuntime``.
        image: ``spec.trainer.image`` when ``options`` has none (empty: the runtime's).
        num_nodes: ``spec.trainer.numNodes`` when ``options`` has none.
        trainer_job: the runtime's replicated job that runs the trainer (``node`` in the
            Trainer's torch runtimes): a launch's ``exclude_nodes`` are patched into it.
        trainer_container: the trainer's container in that job's pods (``node`` in the
            Trainer's torch runtimes): where ``checkpoint_pvc`` is mounted.
        node_loss_window_s: seconds a TrainJob may report running with cause ``node-lost``
            before dispatch fences it (seed 000; 300 matches the default
            ``tolerationSeconds`` of ``node.kubernetes.io/unreachable``, facts B5).
        release_lost_pods: whether :meth:`stop` also force-deletes the object's pods on a node
            that has been NotReady (or gone) for at least the node-loss window, so that the
            fence's stop can finish (facts B5: nothing else releases them); emergency stop
            always does.
        retain_ended_s: seconds an ended TrainJob stays after dispatch first saw it end
            before discovery deletes it (``None``: never), like Slurm's ``MinJobAge``.
        record_on_object: whether discovery writes what it decided onto the TrainJob
            (annotation ``dispatch.dev/observed``), deactivates the Kueue Workload of an
            evicted TrainJob, suspends a TrainJob the Trainer revived after its end, and
            deletes ended ones after ``retain_ended_s``. Off for a read-only reader: its
            memory is then this process's only.
        watch_timeout_s: lifetime of one watch request; a server that sends bookmarks sends
            one about 2 s before it ends (from its watch cache), which bounds how long a newly
            ended TrainJob waits for the pod evidence to catch up (see the package docstring,
            "Consistency").
        evidence_wait_s: the longest a newly ended TrainJob waits for the watches to confirm
            they caught up (bookmarks) before its end is decided anyway; only while every
            watch is healthy. Keep it above ``watch_timeout_s`` (with room for a reconnect):
            then a server that sends bookmarks always confirms first, and the bound decides
            only on quiet streams of a server that sends none (kube-apiserver 1.20.2 sent none
            in 30 s and 75 s watches, cached or not, measured on the real-apiserver lane), or
            of a resource served without a watch cache. Events arrive within moments, so the
            bound costs latency on such clusters, never a wrong cause.
        request_timeout_s: read timeout of every other request.
        sync_timeout_s: seconds the first discovery waits for the watches' first lists.
        max_concurrency: blocking client calls in flight at once (the watches have their own
            threads).
        kubeconfig: kubeconfig file for :meth:`KubeflowBackend.from_settings` (empty: the
            default, ``$KUBECONFIG`` or ``~/.kube/config``).
        context: kubeconfig context (empty: the current one).
        in_cluster: use the pod's service account instead of a kubeconfig.
    """

    namespaces: tuple[str, ...] = ("default",)
    gate: GateMode = GateMode.KUEUE
    gate_name: str = "dispatch.dev/start-gate"
    queue: str = ""
    runtime: str = "torch-distributed"
    runtime_kind: str = "ClusterTrainingRuntime"
    image: str = ""
    num_nodes: int = 1
    trainer_job: str = "node"
    trainer_container: str = "node"
    node_loss_window_s: float = 300.0
    release_lost_pods: bool = True
    retain_ended_s: float | None = 3600.0
    record_on_object: bool = True
    watch_timeout_s: float = 30.0
    evidence_wait_s: float = 60.0
    request_timeout_s: float = 30.0
    sync_timeout_s: float = 10.0
    max_concurrency: int = 8
    kubeconfig: str = ""
    context: str = ""
    in_cluster: bool = False

    def __post_init__(self) -> None:
        if not self.namespaces:
            raise ValueError("namespaces: at least one namespace is needed")
        if len(set(self.namespaces)) != len(self.namespaces):
            raise ValueError(f"namespaces: {self.namespaces} repeats a namespace")
        if not self.node_loss_window_s > 0:
            raise ValueError(f"node_loss_window_s must be > 0, got {self.node_loss_window_s}")
        for name in ("watch_timeout_s", "evidence_wait_s", "request_timeout_s", "sync_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.retain_ended_s is not None and self.retain_ended_s < 0:
            raise ValueError(f"retain_ended_s must be >= 0 or None, got {self.retain_ended_s}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {self.num_nodes}")
        if self.runtime_kind not in ("ClusterTrainingRuntime", "TrainingRuntime"):
            raise ValueError(
                "runtime_kind must be ClusterTrainingRuntime or TrainingRuntime, "
                f"got {self.runtime_kind!r}"
            )


def kubeflow_declarations(settings: KubeflowSettings) -> Declarations:
    """What the Kubeflow backend declares (seed 000, "The node-loss fence"): the node-loss
    window of ``settings``, no native recovery actions, a cessation signal (from the state
    of the nodes the object ran on), an emergency stop, and a start idempotent per attempt
    (the TrainJob's name is deterministic per launch, and a second create of it finds the
    one the first made: :meth:`KubeflowBackend.start`). Needs no Kubernetes client."""
    return Declarations(
        node_loss_window_s=settings.node_loss_window_s,
        cessation_signal=True,
        emergency_stop=True,
        idempotent_start=True,
    )
