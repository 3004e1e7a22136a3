"""The HTTP API service: operator commands, statuses, records, escalations, an SSE stream of
status, metrics, health and an OpenAPI document (DESIGN.md section 1; issue 5)."""
