"""``POST /v1/jobs`` with ``{job}`` in ``spec.checkpoint``: the placeholder becomes the job's
id when the job is created, so the record holds a concrete root of the job's own."""

from __future__ import annotations

import pytest

from dispatch_core import JobCreated
from tests.integration.api.support import SPEC, Api

pytestmark = pytest.mark.integration


async def test_job_in_the_checkpoint_root_is_recorded_as_the_job_id(api: Api) -> None:
    """``{job}`` in ``spec.checkpoint`` is expanded once, when the job is created: the record
    (what every backend folds) holds the concrete root, a second submission of the same body
    gets its own, and a superseding job keeps the old job's root to continue from it."""
    spec = {**SPEC, "checkpoint": "/ckpt/digits/{job}/{run}"}
    first = (await api.submit(name="digits", spec=spec))["job_id"]
    second = (await api.submit(name="digits", spec=spec))["job_id"]
    assert first != second
    for job_id in (first, second):
        record = await api.call("GET", f"/v1/jobs/{job_id}/record")
        assert record.status == 200, record.text
        created = record.body["events"][0]["event"]
        assert created["type"] == "job.created"
        assert created["spec"]["checkpoint"] == f"/ckpt/digits/{job_id}/{{run}}"

    assert (await api.command(first, "cancel")).status == 200
    reply = await api.command(first, "supersede")
    assert reply.status == 201, reply.text
    (created,) = await api.events(reply.body["new_job_id"])
    assert isinstance(created, JobCreated)
    assert created.spec.checkpoint == f"/ckpt/digits/{first}/{{run}}"
