"""Check a spec's ``options`` against the backend of its cluster, before anything is recorded.

``JobSpec.options`` are backend options (Slurm's ``partition``, a TrainJob's ``nodes``, every
backend's ``time``). Each backend reads them at launch; a value it can't read makes every
launch fail the same way (``launch-failed``), which the user only learns after the retries.
:func:`check_options` asks the cluster's backend the same questions at submission (the API
calls it for ``POST /v1/jobs``, so ``dispatch submit`` gets the answer): it is pure, builds no
client and calls no scheduler, and each backend answers with the very functions its launch
uses, so a value is refused at submission exactly when a launch would refuse it.

What each backend refuses:

* ``local``: an option it doesn't read (it reads ``chdir`` and ``time``; the message lists
  them), and a ``time`` not in Slurm's format
  (:func:`~dispatch_backends.time_limit.parse_time_limit`). Its launch still ignores an
  unknown option, so a job recorded before this check still launches.
* ``slurm``: every other option is passed to ``sbatch`` as ``--<name>=<value>``, so a name
  is not checked against sbatch's list; refused are a name that isn't an option name, a
  name dispatch sets itself (``job_name``, ``comment``, ``hold``, ...), a ``requeue`` other
  than yes/no, and a ``time`` not in Slurm's format
  (:func:`dispatch_backends.slurm.script.check_option`).
* ``kubeflow``: options it doesn't read are ignored (a spec written for another backend
  still launches); refused are ``nodes`` / ``procs_per_node`` / ``gpus`` that aren't whole
  numbers >= 1, a ``time`` not in Slurm's format, a ``namespace`` the cluster doesn't watch,
  and, in ``kueue`` gate mode, no ``queue`` when the cluster sets none
  (:func:`dispatch_backends.kubeflow.body.check_options`).

What only the scheduler can say (a partition that doesn't exist, an sbatch option it
doesn't know, a ``chdir`` missing on the node) is still learnt at launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dispatch_backends.config import ClusterKind

__all__ = ["InvalidOption", "check_options"]


class InvalidOption(ValueError):
    """A spec's option that the cluster's backend would refuse at launch.

    Attributes:
        key: the option's name (the field at fault is ``spec.options.<key>``).
        reason: why, naming the value (and the known options, for an unknown one).
    """

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key, self.reason = key, reason


def check_options(cluster: ClusterKind, options: Mapping[str, str]) -> None:
    """Refuse the ``options`` that ``cluster``'s backend would refuse at launch (its kind's
    ``check_options``).

    Pure: reads ``cluster``'s settings only (no client is built, no scheduler is asked).

    Args:
        cluster: the cluster the spec names, as the clusters file declares it.
        options: the spec's ``options``.

    Raises:
        InvalidOption: the first option refused, in the order of ``options`` (see the module
            docstring for each backend's rules).
    """
    cluster.check_options(options)
