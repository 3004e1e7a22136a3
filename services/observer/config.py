"""The observer's configuration, from ``OBSERVER_*`` environment variables.

=============================  ================================================================
variable                       meaning
=============================  ================================================================
``OBSERVER_CLUSTER``           the cluster this observer serves (a name in the clusters file);
                               required
``OBSERVER_CLUSTERS_FILE``     the clusters file (TOML or JSON, see
                               ``dispatch_backends.config``); required
``OBSERVER_NATS_URL``          NATS server URL(s), comma-separated (default
                               ``nats://127.0.0.1:4222``)
``OBSERVER_NATS_*``            the identity (``observer-<cluster>``) and TLS:
                               ``NKEY_SEED_FILE``, ``CREDS_FILE``, ``USER`` with
                               ``PASSWORD_FILE`` or ``PASSWORD``, ``TLS_CA_FILE``,
                               ``TLS_CERT_FILE``, ``TLS_KEY_FILE``, ``INBOX_PREFIX``
                               (``_INBOX.observer-<cluster>``); see
                               ``services.common.nats_settings``
``OBSERVER_NAMESPACE``         subject/stream namespace of the installation (default: none,
                               the public contract's names)
``OBSERVER_STREAM_REPLICAS``   replicas of the streams it creates if missing (default 1)
``OBSERVER_POLL_INTERVAL_S``   seconds between two polls (default: the backend's, 1 s local)
``OBSERVER_STORE_TIMEOUT_S``   seconds to wait for each JetStream reply (default 5)
``OBSERVER_HTTP_HOST``         where ``/healthz`` and ``/metrics`` listen (default 127.0.0.1)
``OBSERVER_HTTP_PORT``         their port (default 8081; 0 picks a free one)
``OBSERVER_SHUTDOWN_GRACE_S``  longest clean shutdown after SIGTERM, seconds (default 10)
``OBSERVER_LOG_LEVEL``         ``debug``, ``info`` (default), ``warning`` or ``error``
``OBSERVER_LOG_JSON``          JSON log lines (default true)
=============================  ================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from services.common.config import ConfigError, from_env
from services.common.nats_settings import NatsSettings, check_nats_settings

__all__ = ["ObserverConfig"]


class ObserverConfig(NatsSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything the observer is configured with (see the module docstring)."""

    cluster: str = ""
    clusters_file: str = ""
    namespace: str = ""
    stream_replicas: int = 1
    poll_interval_s: float | None = None
    store_timeout_s: float = 5.0
    http_host: str = "127.0.0.1"
    http_port: int = 8081
    shutdown_grace_s: float = 10.0
    log_level: str = "info"
    log_json: bool = True

    def __post_init__(self) -> None:
        if self.poll_interval_s is not None and not self.poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be > 0, got {self.poll_interval_s}")
        if not self.store_timeout_s > 0:
            raise ValueError(f"store_timeout_s must be > 0, got {self.store_timeout_s}")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")

    @classmethod
    def from_env(cls, env: Mapping[str, str], prefix: str = "OBSERVER_") -> Self:
        """Build the config from ``env``.

        Raises:
            ConfigError: an unknown ``OBSERVER_*`` variable, a bad value, or a required one
                missing (``OBSERVER_CLUSTER``, ``OBSERVER_CLUSTERS_FILE``).
        """
        cfg = from_env(cls, env, prefix)
        for name in ("cluster", "clusters_file"):
            if not getattr(cfg, name):
                raise ConfigError(f"{prefix}{name.upper()} is required")
        check_nats_settings(cfg, prefix)
        return cfg
