"""The OpenAPI 3.1 document of the HTTP API, generated from the msgspec Structs that decode
the requests and encode the answers (:mod:`services.api.schemas`), so the document can't
drift from the code.

msgspec writes JSON Schema 2020-12, which is OpenAPI 3.1's schema dialect. Two things are
added to what it writes:

* every object schema a request body reaches gets ``additionalProperties: false``: the API
  refuses unknown fields at any depth (the core's codec checks nested ones);
* the submitted spec is its own component, ``JobSpecRequest``: ``JobSpec`` plus the bounds
  the API enforces (:data:`~services.api.schemas.SPEC_LIMITS`) and the clusters this
  deployment knows, so a generated client (or schemathesis) sends what is accepted. The
  ``JobSpec`` of answers stays as recorded.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Any, Final

import msgspec

from dispatch_core import JOB_ID_PATTERN, Status
from services.api.jobindex import MAX_OFFSET
from services.api.schemas import (
    COMMAND_REQUESTS,
    MAX_LAUNCH_ATTEMPTS,
    SPEC_LIMITS,
    AbandonRequest,
    CommandResponse,
    ErrorBody,
    EscalationList,
    HoldRequest,
    JobList,
    ReasonRequest,
    RecordResponse,
    SubmitRequest,
    SubmitResponse,
    SupersedeRequest,
)

__all__ = ["COMMAND_SUMMARIES", "IDEMPOTENCY_KEY_PATTERN", "build_openapi"]

IDEMPOTENCY_KEY_PATTERN: Final = r"^[!-~]{1,200}$"
"""An ``Idempotency-Key``: 1 to 200 printable ASCII characters, no spaces."""

COMMAND_SUMMARIES: Final[dict[str, str]] = {
    "hold": "Place an actor hold: nothing launches and no gate opens until it is released.",
    "release": "Release an actor hold (a recovery hold is refused: resubmit, cancel or give-up).",
    "resubmit": "Lift a recovery hold and run a new submission (no budget is spent).",
    "cancel": "Cancel the job: its outcome is cancelled and its live objects are stopped.",
    "give-up": "Fail a held job with the cause that ended it.",
    "abandon": "Close an unknown launch or dispose of a foreign object (a human actor only).",
    "supersede": "Create a new job from this finished one: same spec and policy, generation + 1.",
    "emergency-stop": "Kill every live object of the job at once (and cancel it if it has no "
    "outcome).",
}

_REF: Final = "#/components/schemas/{name}"
_REQUESTS: Final = (SubmitRequest, ReasonRequest, HoldRequest, AbandonRequest, SupersedeRequest)
_RESPONSES: Final = (
    SubmitResponse,
    CommandResponse,
    RecordResponse,
    JobList,
    EscalationList,
    Status,
    ErrorBody,
)
_JSON: Final = "application/json"


def _query(
    name: str, description: str, schema: dict[str, Any], *, repeated: bool = False
) -> dict[str, Any]:
    """An optional query parameter; ``repeated``: given again (or comma-separated) for more."""
    param: dict[str, Any] = {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }
    if repeated:
        param.update(style="form", explode=True)
    return param


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


def _refs(node: Any) -> Iterator[str]:
    """Every component name referenced inside ``node``."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            yield ref.rsplit("/", 1)[1]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _closed(components: dict[str, Any], roots: Sequence[str]) -> None:
    """Set ``additionalProperties: false`` on every object schema reachable from ``roots``."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        schema = components[name]
        if schema.get("type") == "object" and "properties" in schema:
            schema.setdefault("additionalProperties", False)
        todo.extend(_refs(schema))


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": _ref("ErrorBody")}}}


def _ok(description: str, name: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": _ref(name)}}}


_UNAUTHORIZED: Final = _error("No bearer token, or one the tokens file doesn't hold.")
_UNAVAILABLE: Final = _error(
    "NATS didn't answer, an append's outcome stayed unknown, or every attempt lost a race "
    "(`unavailable`, `busy`): retry, with the same Idempotency-Key."
)
_DEFAULT: Final = _error("Any other error (`{error: {code, message, field?}}`).")
_UNREADABLE: Final = _error(
    "The job's record holds an event that can't be read: it does not decode, or its writer "
    "may not write it (`record-unreadable`; `job_id` and `seq` name the event). Only this "
    "job answers so; listings list it under `unreadable`. Retrying doesn't help: a person "
    "must look at the record."
)

_JOB_PARAM: Final = {
    "name": "job",
    "in": "path",
    "required": True,
    "description": "The job id.",
    "schema": {"type": "string", "pattern": JOB_ID_PATTERN, "maxLength": 63},
}
_IDEMPOTENCY_PARAM: Final = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": (
        "Makes a retried request safe: a request with the same key (from the same actor, for "
        "the same job and command) is answered from the first one's commit, never decided "
        "twice. A request that differs from the first one under its key (another spec or "
        "policy; another command field) is 409 `idempotency-key-reused`, naming the key: "
        "nothing is done."
    ),
    "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": {_JSON: {"schema": _ref(name)}}}


def _paths() -> dict[str, Any]:
    paths: dict[str, Any] = {
        "/v1/jobs": {
            "post": {
                "operationId": "submitJob",
                "summary": "Submit a job; the answer shows its plan before it starts.",
                "parameters": [_IDEMPOTENCY_PARAM],
                "requestBody": _body("SubmitRequest"),
                "responses": {
                    "201": _ok("Created: the job id, its plan and first status.", "SubmitResponse"),
                    "400": _error(
                        "Malformed body, unknown cluster (`unknown-cluster`) or invalid policy "
                        "(`invalid-policy`); `field` names the place."
                    ),
                    "401": _UNAUTHORIZED,
                    "409": _error(
                        "The job id is taken (`refused`), or the Idempotency-Key was first "
                        "used for a different request (`idempotency-key-reused`)."
                    ),
                    "503": _UNAVAILABLE,
                    "default": _DEFAULT,
                },
            },
            "get": {
                "operationId": "listJobs",
                "summary": "List jobs (from their latest Statuses), by id, a page at a time.",
                "description": (
                    "Served from the API's jobs index, current to the request: every Status "
                    "put and record event appended before it is reflected. `total` counts the "
                    "jobs matching the filters (and `after`); page with `offset`/`limit`, or "
                    "with `after` set to the previous page's `next_after`."
                ),
                "parameters": [
                    _query(
                        "state",
                        "Only jobs in these states (repeat, or comma-separate).",
                        {"type": "array", "items": _ref("State")},
                        repeated=True,
                    ),
                    _query(
                        "cluster",
                        "Only jobs on these clusters (their `spec.cluster`; "
                        "repeat, or comma-separate).",
                        {"type": "array", "items": {"type": "string"}},
                        repeated=True,
                    ),
                    _query(
                        "after",
                        "Only jobs with a greater id (a keyset page: the "
                        "previous page's `next_after`).",
                        {"type": "string", "pattern": JOB_ID_PATTERN, "maxLength": 63},
                    ),
                    _query(
                        "offset",
                        "Skip this many of the matching jobs.",
                        {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
                    ),
                    _query(
                        "limit",
                        "At most this many jobs (absent: every job).",
                        {"type": "integer", "minimum": 1, "maximum": MAX_OFFSET},
                    ),
                ],
                "responses": {
                    "200": _ok(
                        "The jobs; jobs whose record can't be read are listed apart "
                        "(`unreadable`: job, seq of the event at fault, why). Such a job "
                        "that had a published Status is also listed with that Status, "
                        "marked `unreadable: true`: it is stale (the supervisor leaves the "
                        "job alone); its own reads answer 422 `record-unreadable`.",
                        "JobList",
                    ),
                    "400": _error(
                        "An unknown state, a bad `after`, `offset` or `limit` (`field` names "
                        "it); a `cluster` neither configured nor any job's (`unknown-cluster`: "
                        "the message names the known clusters)."
                    ),
                    "401": _UNAUTHORIZED,
                    "default": _DEFAULT,
                },
            },
        },
        "/v1/jobs/{job}": {
            "get": {
                "operationId": "getStatus",
                "summary": "The job's Status.",
                "description": (
                    "The Status the supervisor published, or, when there is none yet or the "
                    "record is ahead of it, the record projected by the API with the latest "
                    "Discovery (header `Dispatch-Status-Source`: `supervisor` or `api`)."
                ),
                "parameters": [_JOB_PARAM],
                "responses": {
                    "200": _ok("The Status.", "Status"),
                    "401": _UNAUTHORIZED,
                    "404": _error("No such job."),
                    "422": _UNREADABLE,
                    "default": _DEFAULT,
                },
            }
        },
        "/v1/jobs/{job}/record": {
            "get": {
                "operationId": "getRecord",
                "summary": "The job's record: its events with their seqs.",
                "parameters": [
                    _JOB_PARAM,
                    _query(
                        "after",
                        "Only events with a greater seq (0: all).",
                        {"type": "integer", "minimum": 0, "maximum": 2**53},
                    ),
                ],
                "responses": {
                    "200": _ok("The events.", "RecordResponse"),
                    "400": _error("A bad `after`."),
                    "401": _UNAUTHORIZED,
                    "404": _error("No such job."),
                    "422": _UNREADABLE,
                    "default": _DEFAULT,
                },
            }
        },
        "/v1/jobs/{job}/stream": {
            "get": {
                "operationId": "streamStatus",
                "summary": "Server-sent events: the job's Status, then every change, in order.",
                "description": (
                    "Each Status is an event `status` whose `id` is its seq on the status "
                    "stream and whose `data` is the Status JSON; a reconnecting client sends "
                    "`Last-Event-ID` to skip what it has. Before the supervisor publishes a "
                    "first Status, the API sends one it projected (without an id). Comments "
                    "(`: heartbeat`) keep an idle stream open. The stream runs until the "
                    "client disconnects or the service stops. A job whose record can't be "
                    "read gets, at once, one event `error` whose `data` is the error body "
                    "(`{error: {code: record-unreadable, message, job_id, seq}}`), and the "
                    "stream ends: reconnecting gets the same (a person must look at the "
                    "record; a client should stop, not retry)."
                ),
                "parameters": [
                    _JOB_PARAM,
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string"},
                    },
                ],
                "responses": {
                    "200": {
                        "description": "The event stream.",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    },
                    "401": _UNAUTHORIZED,
                    "404": _error("No such job."),
                    "default": _DEFAULT,
                },
            }
        },
        "/v1/jobs/{job}/logs": {
            "get": {
                "operationId": "getLogs",
                "summary": "An execution's output (stdout or stderr), streamed.",
                "description": (
                    "The output of one execution (submission N) of the job: the output of "
                    "the latest object launched for it, read by the cluster's observer "
                    "(local: the object's files; Slurm: the job's output file; Kubeflow: the "
                    "trainer node-0 pod's log). The body "
                    "is the raw bytes from `offset` on, sent as they are read. Headers: "
                    "`Dispatch-Execution` (N), `Dispatch-Object` (`<cluster>/<id>`), "
                    "`Dispatch-Output-Location` (where the output is) and "
                    "`Dispatch-Output-Live` (whether more may come). With `follow=true` an "
                    "execution not launched yet is waited for, and the body runs until the "
                    "object has ended and everything was sent. An error once the body has "
                    "begun (the observer stopped answering) cuts the body short: the "
                    "response then ends without its last chunk."
                ),
                "parameters": [
                    _JOB_PARAM,
                    _query(
                        "execution",
                        "The submission N (default: the job's latest object).",
                        {"type": "integer", "minimum": 1, "maximum": 2**53},
                    ),
                    _query(
                        "stream",
                        "Which output (default stdout).",
                        {"type": "string", "enum": ["stdout", "stderr"]},
                    ),
                    _query(
                        "offset",
                        "The byte offset to start at (default 0).",
                        {"type": "integer", "minimum": 0, "maximum": 2**62},
                    ),
                    _query(
                        "limit",
                        "The most bytes to send (default: no bound; 0 sends "
                        "only the headers, e.g. to learn where the output is).",
                        {"type": "integer", "minimum": 0, "maximum": 2**62},
                    ),
                    _query(
                        "follow",
                        "Keep sending until the execution ends.",
                        {"type": "string", "enum": ["true", "false"]},
                    ),
                ],
                "responses": {
                    "200": {
                        "description": "The output's bytes.",
                        "content": {
                            "application/octet-stream": {
                                "schema": {"type": "string", "format": "binary"}
                            }
                        },
                    },
                    "400": _error("A bad `execution`, `stream`, `offset`, `limit` or `follow`."),
                    "401": _UNAUTHORIZED,
                    "404": _error(
                        "No such job, no such execution, or the backend keeps no output of it."
                    ),
                    "422": _UNREADABLE,
                    "501": _error("The cluster's backend can't read output."),
                    "503": _error("The cluster's observer did not answer, or can't read now."),
                    "default": _DEFAULT,
                },
            }
        },
        "/v1/escalations": {
            "get": {
                "operationId": "listEscalations",
                "summary": "Escalations across jobs (from their records), oldest first.",
                "parameters": [
                    _query(
                        "delivered",
                        "Only delivered (`true`) or undelivered (`false`) ones.",
                        {"type": "string", "enum": ["true", "false"]},
                    ),
                    _query(
                        "job",
                        "Only this job's.",
                        {"type": "string", "pattern": JOB_ID_PATTERN, "maxLength": 63},
                    ),
                ],
                "responses": {
                    "200": _ok(
                        "The escalations; jobs whose record can't be read are listed apart "
                        "(`unreadable`: job, seq, why).",
                        "EscalationList",
                    ),
                    "400": _error("A bad `delivered` or `job`."),
                    "401": _UNAUTHORIZED,
                    "422": _UNREADABLE,
                    "default": _DEFAULT,
                },
            }
        },
        "/healthz": {
            "get": {
                "operationId": "health",
                "summary": "200 once NATS is connected and the streams exist, 503 before.",
                "security": [],
                "responses": {
                    "200": _health("Up."),
                    "503": _health("Starting."),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "The metrics, in Prometheus' text format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "The OpenAPI 3.1 document.",
                        "content": {_JSON: {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    }
    for command, request in COMMAND_REQUESTS.items():
        created = command == "supersede"
        responses: dict[str, Any] = {
            "201" if created else "200": _ok(
                "Committed: the events, the job's status after them"
                + (", and the new job's id and plan." if created else "."),
                "CommandResponse",
            ),
            "400": _error("Malformed body; `field` names it."),
            "401": _UNAUTHORIZED,
            "404": _error("No such job."),
            "409": _error(
                "Refused by the record (`refused`): the message is the core's reason; or the "
                "Idempotency-Key was first used for a different request "
                "(`idempotency-key-reused`)."
            ),
            "422": _UNREADABLE,
            "503": _UNAVAILABLE,
            "default": _DEFAULT,
        }
        if command == "abandon":
            responses["403"] = _error("Only a human actor may abandon (`forbidden`).")
        paths[f"/v1/jobs/{{job}}/{command}"] = {
            "post": {
                "operationId": "command" + "".join(p.title() for p in command.split("-")),
                "summary": COMMAND_SUMMARIES[command],
                "parameters": [_JOB_PARAM, _IDEMPOTENCY_PARAM],
                "requestBody": _body(request.__name__),
                "responses": responses,
            }
        }
    return paths


def _health(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {
            _JSON: {
                "schema": {
                    "type": "object",
                    "properties": {"status": {"type": "string"}, "service": {"type": "string"}},
                    "required": ["status", "service"],
                }
            }
        },
    }


def _spec_request(job_spec: dict[str, Any], clusters: Sequence[str]) -> dict[str, Any]:
    """``JobSpec`` with the bounds the API enforces and the known clusters."""
    schema = copy.deepcopy(job_spec)
    schema["title"] = "JobSpecRequest"
    props = schema["properties"]
    for name, (low, high) in SPEC_LIMITS.items():
        props[name].update(exclusiveMinimum=low, maximum=high)
    props["max_launch_attempts"].update(minimum=1, maximum=MAX_LAUNCH_ATTEMPTS)
    if clusters:
        props["cluster"]["enum"] = list(clusters)
    props["cluster"]["description"] = "A cluster this API knows: " + (
        ", ".join(clusters) or "none is configured"
    )
    return schema


def build_openapi(clusters: Sequence[str] = (), *, version: str = "1") -> dict[str, Any]:
    """Return the OpenAPI 3.1 document of the API.

    Args:
        clusters: the clusters a submission may name (they become the spec's ``cluster``
            enum).
        version: the API's version string (``info.version``).
    """
    _, components = msgspec.json.schema_components((*_REQUESTS, *_RESPONSES), ref_template=_REF)
    components["JobSpecRequest"] = _spec_request(components["JobSpec"], clusters)
    components["SubmitRequest"]["properties"]["spec"] = _ref("JobSpecRequest")
    _closed(components, [t.__name__ for t in _REQUESTS])
    document = {
        "openapi": "3.1.0",
        "info": {
            "title": "dispatch API",
            "version": version,
            "description": (
                "Submit training jobs, give operator commands (seed 002), and read statuses, "
                "records and escalations. Every error is `{error: {code, message, field?}}`."
            ),
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
        "components": {
            "schemas": dict(sorted(components.items())),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token from the API's tokens file.",
                }
            },
        },
    }
    # msgspec leaves Python defaults (tuples, frozensets) in the schema: make it plain JSON.
    plain: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(document))
    return plain
