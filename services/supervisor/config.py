"""The supervisor's configuration, from ``SUPERVISOR_*`` environment variables.

==================================  ===========================================================
variable                            meaning
==================================  ===========================================================
``SUPERVISOR_CLUSTERS_FILE``        the clusters file (TOML or JSON, see
                                    ``dispatch_backends.config``); required
``SUPERVISOR_NATS_URL``             NATS server URL(s), comma-separated (default
                                    ``nats://127.0.0.1:4222``)
``SUPERVISOR_NATS_*``               the identity (``supervisor``) and TLS:
                                    ``NKEY_SEED_FILE``, ``CREDS_FILE``, ``USER`` with
                                    ``PASSWORD_FILE`` or ``PASSWORD``, ``TLS_CA_FILE``,
                                    ``TLS_CERT_FILE``, ``TLS_KEY_FILE``, ``INBOX_PREFIX``
                                    (``_INBOX.supervisor``); see
                                    ``services.common.nats_settings``
``SUPERVISOR_NAMESPACE``            subject/stream namespace of the installation (default:
                                    none, the public contract's names)
``SUPERVISOR_STREAM_REPLICAS``      replicas of the streams it creates if missing (default 1)
``SUPERVISOR_DELIVER``              ``notifier`` (default: the notifier service delivers
                                    escalations) or ``<module>:<function>``, an async
                                    ``(job_id, escalation) -> None`` called in-process with
                                    seed 002's semantics
``SUPERVISOR_DELIVER_CHANNEL``      the channel name recorded with an in-process delivery
                                    (default ``in-process``)
``SUPERVISOR_DURABLE``              prefix of the shared durable consumers' names, the same in
                                    every replica (default ``supervisor``)
``SUPERVISOR_MAX_CONCURRENT_PASSES`` passes of different jobs run at once (default 128)
``SUPERVISOR_BACKEND_THREADS``      threads for the backends' blocking calls, in a process run
                                    by ``python -m services.supervisor`` (default 32)
``SUPERVISOR_FETCH_BATCH``          messages fetched at once from each consumer (default 256)
``SUPERVISOR_ACK_WAIT_S``           seconds before an unacked message goes to another replica
                                    (default 60)
``SUPERVISOR_RETRY_S``              seconds before a pass whose action failed (scheduler
                                    unreachable, store error) runs again (default 5)
``SUPERVISOR_LAUNCH_RETRY_S``       seconds a launch is retried while the scheduler is
                                    unreachable before its outcome is recorded unknown
                                    (default 30)
``SUPERVISOR_STORE_TIMEOUT_S``      seconds to wait for each JetStream reply (default 5)
``SUPERVISOR_STORE_RETRY_S``        seconds an append whose outcome is unknown (JetStream
                                    silent) is sent again, with the same msg ids, before the
                                    pass gives up on it (default 60)
``SUPERVISOR_HTTP_HOST``            where ``/healthz`` and ``/metrics`` listen (default
                                    127.0.0.1)
``SUPERVISOR_HTTP_PORT``            their port (default 8082; 0 picks a free one)
``SUPERVISOR_SHUTDOWN_GRACE_S``     longest clean shutdown after SIGTERM, seconds (default 10)
``SUPERVISOR_LOG_LEVEL``            ``debug``, ``info`` (default), ``warning`` or ``error``
``SUPERVISOR_LOG_JSON``             JSON log lines (default true)
``SUPERVISOR_CRASH_AFTER_INTENT``   **test hook**, never set in production: when true the
                                    process SIGKILLs itself right after committing a launch
                                    intent, before calling the backend (the crash of
                                    DESIGN.md section 5, made deterministic for the tests)
==================================  ===========================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from services.common.config import ConfigError, from_env
from services.common.nats_settings import NatsSettings, check_nats_settings

__all__ = ["NOTIFIER", "SupervisorConfig"]

NOTIFIER = "notifier"
"""``deliver`` value: the notifier service delivers escalations; the supervisor does not."""


class SupervisorConfig(NatsSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything a supervisor replica is configured with (see the module docstring)."""

    clusters_file: str = ""
    namespace: str = ""
    stream_replicas: int = 1
    deliver: str = NOTIFIER
    deliver_channel: str = "in-process"
    durable: str = "supervisor"
    max_concurrent_passes: int = 128
    backend_threads: int = 32
    fetch_batch: int = 256
    ack_wait_s: float = 60.0
    retry_s: float = 5.0
    launch_retry_s: float = 30.0
    store_timeout_s: float = 5.0
    store_retry_s: float = 60.0
    http_host: str = "127.0.0.1"
    http_port: int = 8082
    shutdown_grace_s: float = 10.0
    log_level: str = "info"
    log_json: bool = True
    crash_after_intent: bool = False

    def __post_init__(self) -> None:
        for name in ("ack_wait_s", "retry_s", "store_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("launch_retry_s", "store_retry_s", "shutdown_grace_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_concurrent_passes", "backend_threads", "fetch_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.deliver != NOTIFIER and ":" not in self.deliver:
            raise ValueError(
                f"deliver must be {NOTIFIER!r} or '<module>:<function>', got {self.deliver!r}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str], prefix: str = "SUPERVISOR_") -> Self:
        """Build the config from ``env``.

        Raises:
            ConfigError: an unknown ``SUPERVISOR_*`` variable, a bad value, or
                ``SUPERVISOR_CLUSTERS_FILE`` missing.
        """
        cfg = from_env(cls, env, prefix)
        if not cfg.clusters_file:
            raise ConfigError(f"{prefix}CLUSTERS_FILE is required")
        check_nats_settings(cfg, prefix)
        return cfg
