"""Writer kinds: which kind of writer may append each event type (DESIGN.md section 5; issue 10,
"Writer kinds").

Every record append is made by one of three kinds of writer, and the NATS contract (v2) puts
the kind in the subject it is appended to (``dispatch.record.<job>.<writer>``), where
nats-server's permissions, not dispatch's code, let each service's identity publish only its
own. :data:`WRITERS` is the one table saying which kinds may write each event type; ``fold``
refuses an event whose writer may not write it (:class:`~dispatch_core.errors.WriterRefused`),
so a compromised notifier can't append an operator's command, and only the API appends what a
person decided.

Audit of who appends what (the table follows it):

* ``api`` (services/api/operations.py, through ``decide``): ``job.created`` (submit, and the new
  job of a supersede), ``hold.placed`` of an actor hold, ``hold.released`` by ``release``,
  ``resubmit``, ``cancel`` or ``give-up``, ``submission.opened`` of a ``resubmit``,
  ``cancel.requested``, ``give-up``, ``abandoned``, ``emergency-stop.requested``,
  ``superseded``, and the ``outcome.committed`` (``cancelled``, ``failed``) and
  ``escalation.committed`` (``give-up``) a cancel or a give-up commits.
* ``supervisor`` (services/supervisor/passes.py, through ``next_steps``): launches and their
  outcomes, gates, stop intents, node-loss, cessation and progress observations, ended executions,
  recoveries, recovery holds and the releases the planner makes (``outcome``, ``replaced``,
  ``ceased``), submissions it opens, outcomes and escalations; and ``escalation.delivered``
  when it delivers in process (``SUPERVISOR_DELIVER=module:function``).
* ``notifier`` (services/notifier/service.py): ``escalation.delivered`` only.

Where a type is written by both the API and the supervisor, the table looks at the field that
says which (a hold's ``kind``, a release's ``how``, a submission's ``why``, an outcome's
``state``, an escalation's ``id``). A value the table does not list for the API is the
planner's: a new value a person decides must be added here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from dispatch_core.escalations import EscalationKind, escalation_id
from dispatch_core.events import (
    Abandoned,
    CancelRequested,
    CessationObserved,
    EmergencyStopRequested,
    EscalationCommitted,
    EscalationDelivered,
    ExecutionEnded,
    GateOpened,
    GaveUp,
    HoldHow,
    HoldPlaced,
    HoldReleased,
    JobCreated,
    JobEvent,
    LaunchIntended,
    LaunchRecorded,
    LaunchRefused,
    LaunchUnknown,
    NoCapacityObserved,
    NodeLossObserved,
    OutcomeCommitted,
    ProgressObserved,
    RecoveryCommitted,
    StopRequested,
    SubmissionOpened,
    SubmissionWhy,
    Superseded,
)

__all__ = ["WRITERS", "ByField", "WriterKind", "WriterRule", "event_tag", "may_write", "writers_of"]


class WriterKind(enum.StrEnum):
    """The kind of writer that appended an event (a closed list; the record subject's last
    token in contract v2)."""

    API = "api"
    """The API: everything a person decided (operator commands, job creation)."""
    SUPERVISOR = "supervisor"
    """A supervisor replica: what the planner decided and what its actions found."""
    NOTIFIER = "notifier"
    """The notifier: deliveries of escalations, nothing else."""


@dataclass(frozen=True, slots=True)
class ByField:
    """A rule that looks at one field of the event: ``cases`` by the field's value (its string
    form; an enum's name), ``otherwise`` for any other value."""

    field: str
    cases: Mapping[str, frozenset[WriterKind]]
    otherwise: frozenset[WriterKind]

    def writers(self, event: JobEvent) -> frozenset[WriterKind]:
        """The kinds that may write ``event``."""
        value = getattr(event, self.field)
        return self.cases.get(str(value), self.otherwise)


WriterRule = frozenset[WriterKind] | ByField
"""Who may write one event type: a fixed set of kinds, or a rule over one of its fields."""

_API: Final = frozenset({WriterKind.API})
_SUPERVISOR: Final = frozenset({WriterKind.SUPERVISOR})
_API_OR_SUPERVISOR: Final = frozenset({WriterKind.API, WriterKind.SUPERVISOR})
_DELIVERERS: Final = frozenset({WriterKind.SUPERVISOR, WriterKind.NOTIFIER})

WRITERS: Final[Mapping[type[JobEvent], WriterRule]] = {
    # What a person decided: the API only.
    JobCreated: _API,
    CancelRequested: _API,
    GaveUp: _API,
    Abandoned: _API,
    EmergencyStopRequested: _API,
    Superseded: _API,
    HoldPlaced: ByField("kind", {"actor": _API, "recovery": _SUPERVISOR}, otherwise=frozenset()),
    HoldReleased: ByField(
        "how",
        {how: _API for how in (HoldHow.RELEASE, HoldHow.RESUBMIT, HoldHow.CANCEL, HoldHow.GIVE_UP)},
        otherwise=_SUPERVISOR,  # the planner's: outcome, replaced, ceased
    ),
    SubmissionOpened: ByField("why", {SubmissionWhy.RESUBMIT: _API}, otherwise=_SUPERVISOR),
    # A cancel or a give-up commits its outcome (and give-up's escalation) with the command;
    # any other outcome or escalation is the planner's.
    OutcomeCommitted: ByField(
        "state", {"cancelled": _API_OR_SUPERVISOR, "failed": _API_OR_SUPERVISOR}, _SUPERVISOR
    ),
    EscalationCommitted: ByField(
        "id", {escalation_id(EscalationKind.GIVE_UP): _API_OR_SUPERVISOR}, _SUPERVISOR
    ),
    # What the planner decided and what the supervisor's actions found.
    LaunchIntended: _SUPERVISOR,
    LaunchRecorded: _SUPERVISOR,
    LaunchRefused: _SUPERVISOR,
    LaunchUnknown: _SUPERVISOR,
    GateOpened: _SUPERVISOR,
    StopRequested: _SUPERVISOR,
    NodeLossObserved: _SUPERVISOR,
    NoCapacityObserved: _SUPERVISOR,
    ExecutionEnded: _SUPERVISOR,
    RecoveryCommitted: _SUPERVISOR,
    CessationObserved: _SUPERVISOR,
    ProgressObserved: _SUPERVISOR,
    # Deliveries: the notifier, or a supervisor delivering in process.
    EscalationDelivered: _DELIVERERS,
}
"""Which writer kinds may write each event type (DESIGN.md section 5, issue 10). Every
``JobEvent`` type has an entry (a test checks it)."""


def writers_of(event: JobEvent) -> frozenset[WriterKind]:
    """Return the writer kinds that may write ``event`` (empty: none may)."""
    rule = WRITERS.get(type(event), frozenset())
    if isinstance(rule, ByField):
        return rule.writers(event)
    return rule


def may_write(writer: WriterKind, event: JobEvent) -> bool:
    """Return whether a writer of kind ``writer`` may append ``event``."""
    return writer in writers_of(event)


def event_tag(event: JobEvent) -> str:
    """The event's wire tag (``job.created``...), for messages."""
    return str(type(event).__struct_config__.tag)
