"""``GET /openapi.json``: a valid OpenAPI 3.1 document, generated from the same msgspec
schemas that decode the requests, covering exactly the routes the app serves."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from openapi_spec_validator.validation import OpenAPIV31SpecValidator

from services.api.jobindex import LISTING_PARAMS
from services.api.openapi import build_openapi
from services.api.schemas import SubmitRequest
from tests.integration.api.support import Api

pytestmark = pytest.mark.integration


async def _document(api: Api) -> dict[str, Any]:
    reply = await api.call("GET", "/openapi.json", token=None)
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("application/json")
    assert isinstance(reply.body, dict)
    return reply.body


async def test_the_document_is_valid_openapi_3_1(api: Api) -> None:
    document = await _document(api)
    assert document["openapi"] == "3.1.0"
    OpenAPIV31SpecValidator(document).validate()


async def test_the_document_covers_exactly_the_served_routes(api: Api) -> None:
    document = await _document(api)
    documented = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    }
    served = {
        (route.method, route.resource.canonical)
        for route in api.app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    # The web page (services/api/web) and its page-only routes are not the public contract.
    page = {(m, p) for m, p in served if p == "/" or p.startswith("/ui/")}
    assert len(page) == 7
    served -= page
    assert documented == served
    assert len(served) == 18


async def test_the_listing_documents_exactly_the_parameters_it_reads(api: Api) -> None:
    document = await _document(api)
    params = document["paths"]["/v1/jobs"]["get"]["parameters"]
    assert [(p["name"], p["in"]) for p in params] == [(n, "query") for n in LISTING_PARAMS]
    # Each documented parameter is read: a value out of its schema is refused, naming it.
    bad_values = (("state", "x"), ("cluster", "none"), ("after", "A_B"), ("offset", "-1"))
    for name, bad in (*bad_values, ("limit", "0")):
        reply = await api.call("GET", f"/v1/jobs?{name}={bad}")
        assert (reply.status, reply.error["field"]) == (400, name)
    assert (await api.call("GET", "/v1/jobs?cluster=other")).body["total"] == 0


async def test_the_submitted_spec_names_the_known_clusters(api: Api) -> None:
    schemas = (await _document(api))["components"]["schemas"]
    assert schemas["JobSpecRequest"]["properties"]["cluster"]["enum"] == ["local", "other"]
    assert "enum" not in schemas["JobSpec"]["properties"]["cluster"]
    assert schemas["SubmitRequest"]["properties"]["spec"] == {
        "$ref": "#/components/schemas/JobSpecRequest"
    }


async def test_request_bodies_refuse_unknown_fields_at_any_depth(api: Api) -> None:
    schemas = (await _document(api))["components"]["schemas"]
    for name in (
        "SubmitRequest",
        "JobSpecRequest",
        "RecoveryPolicy",
        "RecoveryRule",
        "SharedCheckpoint",
        "HoldRequest",
        "ReasonRequest",
        "AbandonRequest",
        "AbandonTarget",
        "ObjectRef",
        "SupersedeRequest",
    ):
        assert schemas[name]["additionalProperties"] is False, name
    # dict-valued fields keep their own additionalProperties (their keys are free).
    assert schemas["JobSpecRequest"]["properties"]["options"]["additionalProperties"] == {
        "type": "string"
    }


def test_the_document_is_generated_from_the_decoding_schemas() -> None:
    document = build_openapi(["local"])
    ours = document["components"]["schemas"]["SubmitRequest"]
    _, direct = msgspec.json.schema_components(
        [SubmitRequest], ref_template="#/components/schemas/{name}"
    )
    assert set(ours["properties"]) == set(direct["SubmitRequest"]["properties"])
    assert ours["required"] == direct["SubmitRequest"]["required"]
