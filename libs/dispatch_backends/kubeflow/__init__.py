"""The ``kubeflow`` backend: dispatch's objects are Kubeflow Trainer TrainJobs (issue 7).

Every rule below cites ``shared/labs/kubeflow-facts.md`` (B1 TrainJob, B2 JobSet, B3 Job
and Pod, B4 Kueue, B5 the node-loss hang). Modules:

* :mod:`.settings`: :class:`KubeflowSettings` (namespaces, gate mode, node-loss window,
  retention, timeouts) and the ``JobSpec.options`` a launch may set.
* :mod:`.names`: the naming scheme (``dj-<job>-<N>-<a>``, cut and hashed to fit 63
  characters), labels and annotations.
* :mod:`.body`: the TrainJob a launch creates, and how ``DISPATCH_ATTEMPT``,
  ``DISPATCH_EPOCH`` and the checkpoint root reach the trainer (and the limit of that).
* :mod:`.gate`: the start gate: Kueue's ``kueue.x-k8s.io/admission-gated-by`` or
  ``spec.suspend``; ``admin-held`` when someone else's gate holds it.
* :mod:`.causes`: the pure cause mapping (the cause table), from plain dicts.
* :mod:`.observe`: phase, gate, executions and the memory of first ends, per TrainJob.
* :mod:`.watch`: list-then-watch reflectors, relisting on 410.
* :mod:`.backend`: :class:`KubeflowBackend`, the I/O.

**Stopping.** ``stop`` deletes the TrainJob with ``propagationPolicy: Foreground``, so it is
shown ``stopping`` until its pods are gone and a replacement's gate opens only after that
(seed 000's fence); with ``release_lost_pods`` it also force-deletes its pods on a node
NotReady for at least the node-loss window, which nothing else would ever release (B5).
``emergency_stop`` force-deletes every pod at once.

**Cessation signal** (seed 004): ceased when no pod of the object is left unfinished and
every node it ran on is Ready (a node NotReady or gone may still run its processes).

**Credentials refused.** A 401 Unauthorized or 403 Forbidden is the API server's answer, not
an outage: ``discover`` (and ``cessation``) raise :class:`~dispatch_backends.protocol.BackendError`
with its words, never ``Unreachable``, whether the TrainJob list or a watch's relist is refused,
so no job's state changes on stale caches, and they answer again by themselves once the
watches are allowed back. ``start`` treats 403 (RBAC or admission said no to this create) as
``LaunchRefusedError`` and 401 (an expired token: the launch was never considered) as
``Unreachable``, retried.

Only this package imports ``kubernetes``, and only when :class:`KubeflowBackend` is first
used: the settings can be imported (``dispatch_backends.config`` does) without loading the
client.
"""

from typing import TYPE_CHECKING, Any

from dispatch_backends.kubeflow.names import trainjob_name
from dispatch_backends.kubeflow.settings import OPTIONS, GateMode, KubeflowSettings

if TYPE_CHECKING:
    from dispatch_backends.kubeflow.backend import (
        ForeignObjectError,
        KubeflowBackend,
        ObjectNotFound,
    )

_LAZY = frozenset({"ForeignObjectError", "KubeflowBackend", "ObjectNotFound"})


def __getattr__(name: str) -> Any:
    """Load :mod:`.backend` (and ``kubernetes``) on first use of its names."""
    if name in _LAZY:
        from dispatch_backends.kubeflow import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "OPTIONS",
    "ForeignObjectError",
    "GateMode",
    "KubeflowBackend",
    "KubeflowSettings",
    "ObjectNotFound",
    "trainjob_name",
]
