"""The TrainJob a launch creates (pure: the body as a dict, validated by the API server).

**What reaches the trainer, and how** (v2.3.0 has no ``spec.labels`` or
``podTemplateOverrides`` any more, facts B1): ``spec.trainer.env`` (immutable, merged with
the runtime's trainer environment) carries, after the job's own ``JobSpec.env``:

==========================  ===================================================================
``DISPATCH_JOB``            the job id
``DISPATCH_SUBMISSION``     N
``DISPATCH_GENERATION``     G
``DISPATCH_CHECKPOINT``     the checkpoint root (only when the spec has one)
``DISPATCH_RESTART``        R, from the pod's own label ``jobset.sigs.k8s.io/restart-attempt``
                            through the downward API (``valueFrom.fieldRef``): the JobSet's
                            restart count, which is the backend's R (facts B2)
``DISPATCH_ATTEMPT``        ``<TrainJob name>-<8 random hex>-r$(DISPATCH_RESTART)``: the kubelet
                            expands ``$(DISPATCH_RESTART)``, so every execution (every JobSet
                            restart of every TrainJob) gets its own token, shared by all the
                            pods of that execution (one folder per execution, seed 004)
``DISPATCH_EPOCH``          ``epoch(G, N, 0)``
==========================  ===================================================================

**Limit, honestly:** an environment variable can't be computed, so ``DISPATCH_EPOCH`` is the
epoch of the TrainJob's *first* execution. For a later execution of the same TrainJob (a
JobSet restart, R > 0) the exact epoch is ``DISPATCH_EPOCH + DISPATCH_RESTART`` (R <
10**6, so the sum is ``epoch(G, N, R)``); a trainer that publishes checkpoints must add it
(``dispatch_ckpt`` reads ``DISPATCH_EPOCH`` alone today). Its token is still per execution.
Within one TrainJob the JobSet deletes the old Jobs in the foreground before it recreates
them (facts B2), so R and R+1 of one object only overlap when pods were force-deleted.

``spec.runtimePatches`` (manager ``dispatch.dev/backend``) patches the pod template of the
trainer's replicated job (setting ``trainer_job``): for ``Launch.exclude_nodes`` (nodes lost by
earlier executions) a required node affinity ``kubernetes.io/hostname NotIn``; the options
``node_selector`` (``nodeSelector``), ``tolerations`` and ``checkpoint_pvc`` (a volume of that
PersistentVolumeClaim, mounted at ``checkpoint_mount``, default ``/checkpoints``, in the
trainer container, setting ``trainer_container``). Without any of them there is no patch.
``cpu`` / ``memory`` (requests) and ``cpu_limit`` / ``memory_limit`` go to the trainer's
``resourcesPerNode`` beside ``gpus``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from dispatch_backends.kubeflow.names import (
    ADMISSION_GATED_BY,
    ANNOTATION_GATE,
    ANNOTATION_GENERATION,
    ANNOTATION_NAME,
    ANNOTATION_TOKEN,
    JOBSET_RESTART_LABEL,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_SUBMISSION,
    MANAGER,
    PRIORITY_CLASS_LABEL,
    QUEUE_NAME_LABEL,
    TRAINER,
    trainjob_name,
)
from dispatch_backends.kubeflow.settings import GateMode, KubeflowSettings
from dispatch_backends.protocol import object_name
from dispatch_backends.time_limit import parse_time_limit
from dispatch_core.epoch import epoch
from dispatch_core.steps import Launch

__all__ = [
    "DISPATCH_VARS",
    "RESOURCE_OPTIONS",
    "InvalidLaunch",
    "check_options",
    "namespace_of",
    "trainjob_body",
]

DISPATCH_VARS: Final = (
    "DISPATCH_JOB",
    "DISPATCH_SUBMISSION",
    "DISPATCH_GENERATION",
    "DISPATCH_CHECKPOINT",
    "DISPATCH_RESTART",
    "DISPATCH_ATTEMPT",
    "DISPATCH_EPOCH",
)
"""dispatch's variables; they win over the same names in ``JobSpec.env``."""


class InvalidLaunch(ValueError):
    """The launch can't be expressed as a TrainJob on this cluster (a bad option value, a
    namespace not configured, no Kueue queue in ``kueue`` mode).

    Attributes:
        option: the ``JobSpec.options`` key at fault.
    """

    def __init__(self, message: str, *, option: str) -> None:
        super().__init__(message)
        self.option = option


def _option_int(options: Mapping[str, str], key: str, default: int | None) -> int | None:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as err:
        raise InvalidLaunch(f"option {key}={raw!r}: expected an integer", option=key) from err
    if value < 1:
        raise InvalidLaunch(f"option {key}={raw!r}: expected at least 1", option=key)
    return value


_QUANTITY = re.compile(r"^(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")
RESOURCE_OPTIONS: Final = {
    "cpu": ("requests", "cpu"),
    "memory": ("requests", "memory"),
    "cpu_limit": ("limits", "cpu"),
    "memory_limit": ("limits", "memory"),
}
"""Options that set the trainer's ``resourcesPerNode``: Kubernetes quantities per node."""
DEFAULT_CHECKPOINT_MOUNT: Final = "/checkpoints"
CHECKPOINT_VOLUME: Final = "dispatch-checkpoints"


def _quantity(options: Mapping[str, str], key: str) -> str | None:
    raw = options.get(key)
    if raw is None:
        return None
    value = raw.strip()
    if not _QUANTITY.match(value) or not any(ch in "123456789" for ch in value.split("e")[0]):
        raise InvalidLaunch(
            f"option {key}={raw!r}: expected a positive Kubernetes quantity such as 4, 500m "
            "or 16Gi",
            option=key,
        )
    return value


def _label_key(key: str) -> bool:
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(_LABEL_NAME.match(name))


def _node_selector(options: Mapping[str, str]) -> dict[str, str] | None:
    """``node_selector=k=v,k2=v2`` as a pod ``nodeSelector``."""
    raw = options.get("node_selector")
    if raw is None:
        return None
    selector: dict[str, str] = {}
    for item in (part.strip() for part in raw.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not _label_key(key) or not _LABEL_VALUE.match(value):
            raise InvalidLaunch(
                f"option node_selector={raw!r}: {item!r} is not label=value "
                "(a label name and value as Kubernetes allows them)",
                option="node_selector",
            )
        selector[key] = value
    return selector


def _tolerations(options: Mapping[str, str]) -> list[dict[str, str]] | None:
    """``tolerations=key=value:Effect,key:Effect,key`` as pod tolerations: ``=value`` gives
    operator ``Equal``, none ``Exists``; no effect tolerates every effect."""
    raw = options.get("tolerations")
    if raw is None:
        return None
    out: list[dict[str, str]] = []
    for item in (part.strip() for part in raw.split(",")):
        head, colon, effect = item.partition(":")
        key, eq, value = head.partition("=")
        bad = (
            not _label_key(key)
            or (eq and not _LABEL_VALUE.match(value))
            or (colon and effect not in _EFFECTS)
        )
        if bad:
            raise InvalidLaunch(
                f"option tolerations={raw!r}: {item!r} is not key[=value][:effect] with an "
                f"effect among {', '.join(_EFFECTS)}",
                option="tolerations",
            )
        toleration = {"key": key, "operator": "Equal" if eq else "Exists"}
        if eq:
            toleration["value"] = value
        if colon:
            toleration["effect"] = effect
        out.append(toleration)
    return out


def _checkpoint_volume(options: Mapping[str, str]) -> tuple[str, str] | None:
    """(claim, mount path) of ``checkpoint_pvc`` / ``checkpoint_mount``."""
    claim = options.get("checkpoint_pvc")
    mount = options.get("checkpoint_mount")
    if claim is None:
        if mount is not None:
            raise InvalidLaunch(
                "option checkpoint_mount needs checkpoint_pvc (the claim to mount there)",
                option="checkpoint_mount",
            )
        return None
    if len(claim) > 253 or not _DNS_SUBDOMAIN.match(claim):
        raise InvalidLaunch(
            f"option checkpoint_pvc={claim!r}: not a PersistentVolumeClaim name (lowercase "
            "letters, digits, '-' and '.')",
            option="checkpoint_pvc",
        )
    mount = DEFAULT_CHECKPOINT_MOUNT if mount is None else mount
    if not mount.startswith("/") or mount.rstrip("/") == "" or ":" in mount:
        raise InvalidLaunch(
            f"option checkpoint_mount={mount!r}: expected an absolute directory other than /",
            option="checkpoint_mount",
        )
    return claim, mount.rstrip("/")


def _namespace(options: Mapping[str, str], settings: KubeflowSettings) -> str:
    namespace = options.get("namespace", settings.namespaces[0])
    if namespace not in settings.namespaces:
        raise InvalidLaunch(
            f"namespace {namespace!r} is not one of this cluster's {list(settings.namespaces)}",
            option="namespace",
        )
    return namespace


def _queue(options: Mapping[str, str], settings: KubeflowSettings) -> str | None:
    """The Kueue LocalQueue in ``kueue`` mode (``None`` in ``suspend`` mode)."""
    if settings.gate is not GateMode.KUEUE:
        return None
    queue = options.get("queue", settings.queue)
    if not queue:
        raise InvalidLaunch(
            "gate mode kueue needs a Kueue LocalQueue (setting queue or option queue): "
            "without kueue.x-k8s.io/queue-name Kueue ignores the TrainJob and its "
            "admission gate",
            option="queue",
        )
    return queue


def _time_limit_s(options: Mapping[str, str]) -> int | None:
    if "time" not in options:
        return None
    try:
        return parse_time_limit(options["time"])
    except ValueError as err:
        raise InvalidLaunch(f"option time={options['time']!r}: {err}", option="time") from err


def check_options(options: Mapping[str, str], settings: KubeflowSettings) -> None:
    """Refuse the options :func:`trainjob_body` and :func:`namespace_of` would refuse.

    Pure, with the same helpers they use, so the API can check a submission's options
    without a Kubernetes client. Options the backend doesn't read are ignored, as at
    launch (see :data:`~dispatch_backends.kubeflow.settings.OPTIONS`).

    Raises:
        InvalidLaunch: a ``namespace`` not configured, no ``queue`` in ``kueue`` mode when
            the settings have none, ``nodes`` / ``procs_per_node`` / ``gpus`` not a whole
            number >= 1, a ``time`` not in Slurm's format, ``cpu`` / ``memory`` /
            ``cpu_limit`` / ``memory_limit`` not a positive quantity, a malformed
            ``node_selector`` or ``tolerations``, a ``checkpoint_pvc`` that is not a claim
            name or a ``checkpoint_mount`` that is not an absolute directory; ``option``
            names it.
    """
    _namespace(options, settings)
    _queue(options, settings)
    for key in ("nodes", "procs_per_node", "gpus"):
        _option_int(options, key, None)
    _time_limit_s(options)
    for key in RESOURCE_OPTIONS:
        _quantity(options, key)
    _node_selector(options)
    _tolerations(options)
    _checkpoint_volume(options)


def namespace_of(launch: Launch, settings: KubeflowSettings) -> str:
    """The namespace a launch goes to.

    Raises:
        InvalidLaunch: ``options["namespace"]`` is not one of the configured namespaces
            (discovery would never see it).
    """
    return _namespace(launch.spec.options, settings)


def trainjob_body(launch: Launch, settings: KubeflowSettings, token: str) -> dict[str, Any]:
    """Build the TrainJob of ``launch`` with its start gate closed.

    Args:
        launch: the planner's launch step (job id in ``launch.intent.job_id``).
        settings: the cluster's settings.
        token: random hex making ``DISPATCH_ATTEMPT`` unique across clusters and reuses.

    Returns:
        The body for ``create_namespaced_custom_object``.

    Raises:
        InvalidLaunch: see :func:`namespace_of` and the option rules of
            :data:`dispatch_backends.kubeflow.settings.OPTIONS`.
    """
    job_id = launch.intent.job_id
    spec = launch.spec
    options = spec.options
    name = trainjob_name(job_id, launch.submission, launch.attempt)
    labels = {
        LABEL_JOB: job_id,
        LABEL_SUBMISSION: str(launch.submission),
        LABEL_ATTEMPT: str(launch.attempt),
    }
    annotations = {
        ANNOTATION_NAME: object_name(job_id),
        ANNOTATION_GENERATION: str(launch.generation),
        ANNOTATION_TOKEN: token,
    }
    queue = _queue(options, settings)
    if queue is not None:
        labels[QUEUE_NAME_LABEL] = queue
        annotations[ADMISSION_GATED_BY] = settings.gate_name
    else:
        annotations[ANNOTATION_GATE] = "closed"
    if options.get("priority_class"):
        labels[PRIORITY_CLASS_LABEL] = options["priority_class"]

    trainer: dict[str, Any] = {"env": _env(launch, name, token)}
    image = options.get("image", settings.image)
    if image:
        trainer["image"] = image
    command = list(spec.command)
    if not command and spec.script:
        command = ["/bin/sh", "-c", spec.script]
    if command:
        trainer["command"] = command
    trainer["numNodes"] = _option_int(options, "nodes", settings.num_nodes)
    procs = _option_int(options, "procs_per_node", None)
    if procs is not None:
        trainer["numProcPerNode"] = procs
    gpus = _option_int(options, "gpus", None)
    resources: dict[str, dict[str, str]] = {}
    if gpus is not None:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = str(gpus)
    for key, (kind, resource) in RESOURCE_OPTIONS.items():
        quantity = _quantity(options, key)
        if quantity is not None:
            resources.setdefault(kind, {})[resource] = quantity
    if resources:
        trainer["resourcesPerNode"] = resources

    body_spec: dict[str, Any] = {
        "runtimeRef": {
            "name": options.get("runtime", settings.runtime),
            "kind": options.get("runtime_kind", settings.runtime_kind),
        },
        "trainer": trainer,
        # Held in both modes: in kueue mode Kueue's webhook sets it anyway and unsuspends on
        # admission; should Kueue not manage the TrainJob, it stays held rather than run
        # past a gate nobody enforces.
        "suspend": True,
    }
    pod_spec = _pod_spec_patch(launch, settings)
    if pod_spec:
        body_spec["runtimePatches"] = [_runtime_patch(pod_spec, settings)]
    limit = _time_limit_s(options)
    if limit is not None:
        body_spec["activeDeadlineSeconds"] = limit
    group, version, _ = TRAINER
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": body_spec,
    }


def _env(launch: Launch, name: str, token: str) -> list[dict[str, Any]]:
    spec = launch.spec
    env: list[dict[str, Any]] = [
        {"name": key, "value": value} for key, value in spec.env.items() if key not in DISPATCH_VARS
    ]
    env += [
        {"name": "DISPATCH_JOB", "value": launch.intent.job_id},
        {"name": "DISPATCH_SUBMISSION", "value": str(launch.submission)},
        {"name": "DISPATCH_GENERATION", "value": str(launch.generation)},
    ]
    if spec.checkpoint is not None:
        env.append({"name": "DISPATCH_CHECKPOINT", "value": spec.checkpoint})
    env += [
        {
            "name": "DISPATCH_RESTART",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOBSET_RESTART_LABEL}']"}},
        },
        # $(VAR) is expanded by the kubelet from the variables defined before it.
        {"name": "DISPATCH_ATTEMPT", "value": f"{name}-{token}-r$(DISPATCH_RESTART)"},
        {
            "name": "DISPATCH_EPOCH",
            "value": str(epoch(launch.generation, launch.submission, 0)),
        },
    ]
    return env


def _pod_spec_patch(launch: Launch, settings: KubeflowSettings) -> dict[str, Any]:
    """The trainer pods' spec patch: nodes excluded (affinity), ``node_selector``,
    ``tolerations`` and the checkpoint volume (empty when none applies)."""
    options = launch.spec.options
    pod_spec: dict[str, Any] = {}
    if launch.exclude_nodes:
        pod_spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "NotIn",
                                    "values": list(launch.exclude_nodes),
                                }
                            ]
                        }
                    ]
                }
            }
        }
    selector = _node_selector(options)
    if selector:
        pod_spec["nodeSelector"] = selector
    tolerations = _tolerations(options)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    volume = _checkpoint_volume(options)
    if volume is not None:
        claim, mount = volume
        pod_spec["volumes"] = [
            {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}}
        ]
        pod_spec["containers"] = [
            {
                "name": settings.trainer_container,
                "volumeMounts": [{"name": CHECKPOINT_VOLUME, "mountPath": mount}],
            }
        ]
    return pod_spec


def _runtime_patch(pod_spec: dict[str, Any], settings: KubeflowSettings) -> dict[str, Any]:
    return {
        "manager": MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": settings.trainer_job,
                            "template": {"spec": {"template": {"spec": pod_spec}}},
                        }
                    ]
                }
            }
        },
    }
