"""The API service's configuration: one frozen Struct, built once in ``__main__`` from the
environment (``API_*`` variables, see :func:`services.common.config.from_env`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Self

import msgspec

from services.common.config import from_env
from services.common.nats_settings import NatsSettings, check_nats_settings

__all__ = ["ENV_PREFIX", "ApiConfig"]

ENV_PREFIX = "API_"


class ApiConfig(NatsSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything the API service reads from its environment.

    The NATS connection: ``API_NATS_URL`` (comma-separated URLs), ``API_NATS_NKEY_SEED_FILE``
    (the ``api`` identity's seed) or ``API_NATS_CREDS_FILE`` or ``API_NATS_USER`` with
    ``API_NATS_PASSWORD_FILE``/``API_NATS_PASSWORD``, ``API_NATS_TLS_CA_FILE``,
    ``API_NATS_TLS_CERT_FILE``, ``API_NATS_TLS_KEY_FILE``, ``API_NATS_INBOX_PREFIX``
    (``_INBOX.api``); see :mod:`services.common.nats_settings`.

    Attributes:
        namespace: the dispatch layout's namespace (``""``: the public contract's names).
        stream_replicas: replicas of the streams ``ensure_streams`` creates if missing.
        http_host: the address to listen on (loopback by default: put a TLS proxy in front
            to serve other machines).
        http_port: the port (0 picks a free one; the log line ``api.listening`` names it).
        tokens_file: the bearer tokens file (TOML or JSON, see :mod:`services.api.auth`);
            required.
        clusters_file: the clusters' backend declarations (TOML or JSON, see
            :mod:`services.api.clusters`); without it, no cluster accepts a submission.
        max_body_bytes: the largest request body accepted (413 beyond).
        command_attempts: how many times a command is decided again after losing a race
            to another writer before the API answers 503 (a lost race is never an error
            by itself).
        sse_heartbeat_s: seconds between SSE heartbeat comments on an idle stream; also how
            soon a disconnected client's stream is noticed and closed.
        list_concurrency: most records read at once by ``GET /v1/escalations``.
        shutdown_grace_s: seconds open requests and streams get to finish at shutdown.
        log_level: ``debug``, ``info``, ``warning`` or ``error``.
        log_json: JSON log lines (else plain text).
    """

    namespace: str = ""
    stream_replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 1
    http_host: str = "127.0.0.1"
    http_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    tokens_file: str = ""
    clusters_file: str = ""
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 1024 * 1024
    command_attempts: Annotated[int, msgspec.Meta(ge=1)] = 16
    sse_heartbeat_s: Annotated[float, msgspec.Meta(gt=0)] = 15.0
    list_concurrency: Annotated[int, msgspec.Meta(ge=1)] = 32
    shutdown_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    log_level: str = "info"
    log_json: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str], prefix: str = ENV_PREFIX) -> Self:
        """Build the config from ``env`` (``API_HTTP_PORT=9000`` sets ``http_port``).

        Raises:
            ConfigError: an unknown ``API_*`` variable or a bad value, naming it.
        """
        cfg = from_env(cls, env, prefix)
        check_nats_settings(cfg, prefix)
        return cfg
