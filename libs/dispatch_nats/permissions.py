"""Who may do what on NATS: one identity per service, its exact permissions, and the
nats-server configuration that enforces them (public).

Every dispatch service connects with its own identity, and nats-server, not dispatch's code,
limits each to the subjects its work needs (issue 10):

==================  ==========================================================================
identity            may
==================  ==========================================================================
``api``             append under its own writer kind (``dispatch.record.*.api``); read the
                    record, statuses and discoveries; follow statuses (the SSE stream, the
                    jobs index) and record appends (the jobs index); request output
                    chunks from observers (``dispatch.logs.*``, ``dispatch logs``)
``supervisor``      append as ``supervisor``; publish statuses and pass requests; read
                    everything it folds (the record's last seq and Discoveries also from the
                    stream leader, ``STREAM.MSG.GET``); its three shared durable consumers
                    (``<durable>-record``, ``-discovery``, ``-work``); follow statuses
``notifier``        append as ``notifier`` (deliveries); read the record; its durable
                    consumer on the record stream (``<durable>``)
``observer-<c>``    publish the Discoveries of cluster ``<c>`` and its heartbeat
                    ``dispatch.observer.<c>``; read the discovery stream, and the record
                    (a job's checkpoint root, issue 14)
                    ``dispatch.observer.<c>``; read the discovery stream; answer the
                    output requests of its own cluster (subscribe ``dispatch.logs.<c>``,
                    reply once to each request's reply subject: ``allow_responses``)
``reader``          (optional, for people and tools that read the public contract) read and
                    follow the record, statuses, discoveries and heartbeats (JetStream and
                    core subscriptions); JetStream account info; publish nothing else
==================  ==========================================================================

Common to all: each identity uses its own inbox prefix (:func:`inbox_prefix`,
``_INBOX.<identity>``, nats-py's ``inbox_prefix``) and may subscribe to ``_INBOX.<identity>.>``
only, so no identity can read another's replies, and no identity may publish into any inbox
(an observer answers an output request through nats-server's ``allow_responses``: one reply,
to the reply subject of a request it received, never an inbox of its choosing).
The JetStream API is granted subject by subject (never ``$JS.API.>``): ``STREAM.INFO`` of the
contract's streams, ``DIRECT.GET`` of those it reads, consumer create/info/next and acks of the
consumers it really uses. Nobody may delete or purge a stream or a consumer, update a stream,
or create a stream whose name is not the contract's.

Consumers: no identity may create, update or delete a consumer another identity owns.
nats-server (2.9+, nats-io/nats-server#3409 "secure consumer create") creates *and updates*
consumers through one request: ``CONSUMER.CREATE.<stream>.<name>[.<filter>]``, whose body is
the whole configuration; the name is taken from the subject (a ``durable_name`` in the body
that differs is refused, err 10017; a ``name`` that differs is ignored; a filter that differs
from the subject's is refused, err 10131), and the server updates the consumer of that name
if it exists. A request's ``action`` (create/update) is in the body, out of reach of
permissions. So ownership is enforced on the name in the subject:

- *Durables* (fixed names known here: ``<supervisor_durable>-record``, ``-discovery``,
  ``-work`` owned by ``supervisor``, ``<notifier_durable>`` owned by ``notifier``): every
  identity is *denied* (deny beats allow in nats-server) create, update and delete of each
  durable it does not own, on every form that names it: ``CONSUMER.CREATE.<s>.<d>`` and
  ``CONSUMER.CREATE.<s>.<d>.>`` (filtered), the legacy ``CONSUMER.DURABLE.CREATE.<s>.<d>``,
  and ``CONSUMER.DELETE.<s>.<d>``. The owner is allowed the first two for its own durables.
- *The legacy ephemeral subject* ``CONSUMER.CREATE.<stream>`` (5 tokens, no name) is granted
  to nobody and denied to everybody: the server accepts a ``name`` in its body and then
  updates the consumer of that name, so whoever may send it could re-point another
  service's durable (e.g. give the supervisor's ``-discovery`` consumer a filter matching
  nothing: every job would stay pending). nats-py sends it for an unnamed ordered consumer;
  dispatch's feeds never do (dispatch_nats._feed).
- *Ordered (ephemeral) consumers*, the feeds that follow a stream in order: created by the
  named form with a fresh random name (``ordered-`` and 96 random bits) each time, the first
  and after every reset, so an identity that follows stream ``<s>`` is allowed
  ``CONSUMER.CREATE.<s>.*`` and ``CONSUMER.CREATE.<s>.*.>``, minus the durables above. NATS
  subjects can't be matched by prefix, so ownership of an ephemeral rests on its name being
  known to its creator only: it is never sent anywhere another identity can subscribe (its
  deliveries and acks go through the owner's inbox, no identity may list consumers or
  subscribe to JetStream advisories), and it lives only as long as its creator listens (the
  server removes an ephemeral 5 s after its last subscriber left).

A residual that permissions can't close: a push consumer's deliver subject is in the body,
so an identity allowed to create a consumer on a stream can have the server deliver *that
stream's own messages* (never a payload of its choosing) to any core subject of the account.
Streams ingest no such delivery, and dispatch's core subscribers (wake-ups, heartbeats) use
what they receive only as a hint to read the streams.

Who may create the contract's streams: every service identity (``api``, ``supervisor``,
``notifier``, ``observer-*``), by name only. Each service calls ``ensure_streams`` at start-up
and any of them may start first; allowing it costs nothing once the streams exist, since the
server refuses to create a stream whose name is taken (it never replaces one) and every
identity is refused ``STREAM.UPDATE``, ``STREAM.DELETE`` and ``STREAM.PURGE``. ``reader`` may
not create anything.

:func:`render_server_config` writes the nats-server configuration (users by nkey or by user
and bcrypt password hash, with these permissions; no anonymous user; optional TLS and cluster
blocks; monitoring off). ``dispatch up``, ``dispatch nats init`` (deploy/nats) and the tests
use it, so the three never disagree.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, assert_never

from dispatch_core import WriterKind
from dispatch_nats._feed import ORDERED_CONSUMER_PREFIX
from dispatch_nats.contract import (
    DEFAULT_LAYOUT,
    Layout,
    StreamKind,
    _validate_token,
    validate_cluster,
)
from dispatch_nats.errors import InvalidName

__all__ = [
    "ClusterBlock",
    "Identity",
    "Permissions",
    "Role",
    "TlsBlock",
    "User",
    "durables",
    "inbox_prefix",
    "permissions",
    "render_server_config",
    "service_identities",
    "users",
]

DEFAULT_SUPERVISOR_DURABLE: Final = "supervisor"
DEFAULT_NOTIFIER_DURABLE: Final = "notifier"


class Role(enum.StrEnum):
    """What an identity is for (its permissions follow from it)."""

    API = "api"
    SUPERVISOR = "supervisor"
    NOTIFIER = "notifier"
    OBSERVER = "observer"
    READER = "reader"


@dataclass(frozen=True, slots=True)
class Identity:
    """One NATS identity: a role, and for an observer the cluster it observes."""

    role: Role
    cluster: str = ""
    """The observed cluster (observers only; a subject-safe token)."""

    def __post_init__(self) -> None:
        """Check the cluster.

        Raises:
            InvalidName: an observer without a valid cluster, or another role with one.
        """
        if self.role is Role.OBSERVER:
            validate_cluster(self.cluster)
        elif self.cluster:
            raise InvalidName(
                "identity", f"{self.role}-{self.cluster}", "only observers have a cluster"
            )

    @property
    def name(self) -> str:
        """``api``, ``supervisor``, ``notifier``, ``observer-<cluster>`` or ``reader``."""
        return f"observer-{self.cluster}" if self.role is Role.OBSERVER else self.role.value

    @classmethod
    def parse(cls, name: str) -> Identity:
        """The identity named ``name`` (see :attr:`name`).

        Raises:
            InvalidName: not an identity's name.
        """
        if name.startswith("observer-"):
            return cls(Role.OBSERVER, name.removeprefix("observer-"))
        try:
            role = Role(name)
        except ValueError:
            raise InvalidName(
                "identity", name, "use api, supervisor, notifier, observer-<cluster> or reader"
            ) from None
        return cls(role)

    def __str__(self) -> str:
        return self.name


def service_identities(clusters: Iterable[str], *, reader: bool = True) -> list[Identity]:
    """The identities of one installation: api, supervisor, notifier, one observer per
    cluster, and (``reader``) the read-only one.

    Raises:
        InvalidName: a cluster name is not a subject-safe token.
    """
    out = [Identity(Role.API), Identity(Role.SUPERVISOR), Identity(Role.NOTIFIER)]
    out += [Identity(Role.OBSERVER, c) for c in dict.fromkeys(clusters)]
    if reader:
        out.append(Identity(Role.READER))
    return out


def inbox_prefix(identity: Identity, layout: Layout = DEFAULT_LAYOUT) -> str:
    """The identity's inbox prefix (nats-py ``inbox_prefix``): ``_INBOX.<identity>``, or
    ``_INBOX.<namespace>.<identity>`` under a namespace."""
    if layout.namespace:
        return f"_INBOX.{layout.namespace}.{identity.name}"
    return f"_INBOX.{identity.name}"


@dataclass(frozen=True, slots=True)
class Permissions:
    """The subjects an identity may publish to and subscribe to (nats-server ``allow`` lists;
    everything else is denied), and the publishes denied even where an allow pattern matches
    (``deny_publish``: other identities' consumers; deny beats allow)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()
    allow_responses: bool = False
    """Whether the identity may publish one reply to the reply subject of each request it
    received (nats-server ``allow_responses``: at most one message, within two minutes)."""

    def as_config(self) -> dict[str, Any]:
        """The ``permissions`` object of a nats-server user."""
        publish: dict[str, Any] = {"allow": list(self.publish)}
        if self.deny_publish:
            publish["deny"] = list(self.deny_publish)
        out: dict[str, Any] = {"publish": publish, "subscribe": {"allow": list(self.subscribe)}}
        if self.allow_responses:
            out["allow_responses"] = {"max": 1}
        return out

    def publish_allowed(self, subject: str) -> bool:
        """Whether nats-server lets this identity publish to the literal ``subject``."""
        return any(_matches(p, subject) for p in self.publish) and not any(
            _matches(p, subject) for p in self.deny_publish
        )


def _matches(pattern: str, subject: str) -> bool:
    """Whether NATS subject ``subject`` matches ``pattern`` (``*`` one token, ``>`` the rest)."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def durables(
    layout: Layout,
    *,
    supervisor_durable: str = DEFAULT_SUPERVISOR_DURABLE,
    notifier_durable: str = DEFAULT_NOTIFIER_DURABLE,
) -> dict[tuple[str, str], Role]:
    """Every durable consumer of an installation, ``(stream, name)``, and the role that owns
    it (the only one that may create or update it; nobody may delete it).

    Raises:
        InvalidName: a durable name is not a subject-safe token, or names two durables of
            one stream.
    """
    _validate_token("consumer name", supervisor_durable)
    _validate_token("consumer name", notifier_durable)
    out: dict[tuple[str, str], Role] = {}
    for stream, name, owner in (
        (layout.record_stream, f"{supervisor_durable}-record", Role.SUPERVISOR),
        (layout.discovery_stream, f"{supervisor_durable}-discovery", Role.SUPERVISOR),
        (layout.work_stream, f"{supervisor_durable}-work", Role.SUPERVISOR),
        (layout.record_stream, notifier_durable, Role.NOTIFIER),
    ):
        if (stream, name) in out or name.startswith(ORDERED_CONSUMER_PREFIX):
            raise InvalidName(
                "consumer name", name, "two durables of one stream, or an ordered feed's name"
            )
        out[stream, name] = owner
    return out


def permissions(
    layout: Layout,
    identity: Identity,
    *,
    supervisor_durable: str = DEFAULT_SUPERVISOR_DURABLE,
    notifier_durable: str = DEFAULT_NOTIFIER_DURABLE,
) -> Permissions:
    """Return exactly what ``identity`` may publish and subscribe to under ``layout``.

    Args:
        layout: the installation's names (namespace and JetStream API prefix included).
        identity: whose permissions.
        supervisor_durable: ``SUPERVISOR_DURABLE``, the prefix of the supervisors' consumers.
        notifier_durable: ``NOTIFIER_DURABLE``, the notifiers' consumer.
    """
    js = _JetStream(layout)
    owned = durables(
        layout, supervisor_durable=supervisor_durable, notifier_durable=notifier_durable
    )
    root = layout.root
    pub: list[str] = []
    sub: list[str] = [f"{inbox_prefix(identity, layout)}.>"]
    rec, disc, stat = layout.record_stream, layout.discovery_stream, layout.status_stream
    if identity.role is not Role.READER:
        pub += js.ensure_streams()
    match identity.role:
        case Role.API:
            pub.append(layout.record_writer_filter(WriterKind.API))
            pub += js.info(rec, stat) + js.direct_get(rec, stat, disc)
            # the jobs index (services/api/jobindex.py) follows statuses and record appends
            pub += js.ordered(stat, rec)
            # `dispatch logs`: output chunks asked of each cluster's observer
            pub.append(layout.logs_filter)
        case Role.SUPERVISOR:
            pub += [
                layout.record_writer_filter(WriterKind.SUPERVISOR),
                f"{layout.latest_prefix(StreamKind.STATUS)}.*",
                layout.work_filter,
            ]
            pub += js.direct_get(rec, stat, disc)
            # a pass's reads checked against the stream leader (a replica may lag on a
            # cluster): the record's last seq and the latest Discovery, read-only
            pub += js.leader_get(rec, disc)
            pub += js.ordered(stat)
            for (stream, name), owner in owned.items():
                if owner is Role.SUPERVISOR:
                    pub += js.durable(stream, name)
        case Role.NOTIFIER:
            pub.append(layout.record_writer_filter(WriterKind.NOTIFIER))
            pub += js.direct_get(rec)
            for (stream, name), owner in owned.items():
                if owner is Role.NOTIFIER:
                    pub += js.durable(stream, name)
        case Role.OBSERVER:
            pub += [
                f"{layout.latest_prefix(StreamKind.DISCOVERY)}.{identity.cluster}.*",
                layout.observer_subject(identity.cluster),
            ]
            # the record, read-only: a job's checkpoint root from its job.created (issue 14)
            pub += js.direct_get(disc, rec)
            # `dispatch logs`: its own cluster's output requests, answered once each
            sub.append(layout.logs_subject(identity.cluster))
        case Role.READER:
            pub += js.info(rec, disc, stat) + js.direct_get(rec, disc, stat)
            pub += js.ordered(rec, disc, stat)
            pub.append(f"{layout.api_prefix}.INFO")
            # live core subscriptions to the public subjects too (e.g. the library
            # `Supervisor.run_job`'s wake-ups, a dashboard's heartbeats)
            sub += [
                layout.record_filter,
                f"{layout.latest_prefix(StreamKind.STATUS)}.*",
                f"{layout.latest_prefix(StreamKind.DISCOVERY)}.*.*",
                f"{root}.observer.*",
            ]
        case _:
            assert_never(identity.role)
    deny = js.legacy_ephemeral(*(layout.stream(kind) for kind in StreamKind))
    for (stream, name), owner in owned.items():
        if owner is not identity.role:
            deny += js.foreign_durable(stream, name)
    return Permissions(
        publish=tuple(dict.fromkeys(pub)),
        subscribe=tuple(sub),
        deny_publish=tuple(dict.fromkeys(deny)),
        allow_responses=identity.role is Role.OBSERVER,
    )


class _JetStream:
    """JetStream API subjects, one operation on one stream (or consumer) at a time."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout
        self._p = layout.api_prefix

    def ensure_streams(self) -> list[str]:
        """What ``ensure_streams`` sends: info and create of each contract stream, by name."""
        names = [self._layout.stream(kind) for kind in StreamKind]
        return [f"{self._p}.STREAM.INFO.{n}" for n in names] + [
            f"{self._p}.STREAM.CREATE.{n}" for n in names
        ]

    def info(self, *streams: str) -> list[str]:
        return [f"{self._p}.STREAM.INFO.{s}" for s in streams]

    def direct_get(self, *streams: str) -> list[str]:
        return [f"{self._p}.DIRECT.GET.{s}" for s in streams]

    def leader_get(self, *streams: str) -> list[str]:
        """``STREAM.MSG.GET``: one message, answered by the stream's leader only (read-only;
        ``STREAM.MSG.DELETE`` is another subject, never granted)."""
        return [f"{self._p}.STREAM.MSG.GET.{s}" for s in streams]

    def ordered(self, *streams: str) -> list[str]:
        """An ordered feed (dispatch_nats._feed): an ephemeral consumer created (and
        re-created after a gap) under a fresh name on ``CONSUMER.CREATE.<stream>.<name>``
        (and the filtered ``.<name>.<filter>``), pushing to the identity's inbox, with
        flow-control replies to ``$JS.FC.<stream>.>``. Other identities' durables are denied
        apart (:meth:`foreign_durable`)."""
        out = []
        for s in streams:
            out += [
                f"{self._p}.CONSUMER.CREATE.{s}.*",
                f"{self._p}.CONSUMER.CREATE.{s}.*.>",
                f"$JS.FC.{s}.>",
            ]
        return out

    def legacy_ephemeral(self, *streams: str) -> list[str]:
        """The nameless create subject, whose body may name (and so update) any consumer."""
        return [f"{self._p}.CONSUMER.CREATE.{s}" for s in streams]

    def foreign_durable(self, stream: str, name: str) -> list[str]:
        """Every subject that creates, updates or deletes durable ``name`` of ``stream``."""
        c = f"{stream}.{name}"
        return [
            f"{self._p}.CONSUMER.CREATE.{c}",
            f"{self._p}.CONSUMER.CREATE.{c}.>",
            f"{self._p}.CONSUMER.DURABLE.CREATE.{c}",
            f"{self._p}.CONSUMER.DELETE.{c}",
        ]

    def durable(self, stream: str, name: str) -> list[str]:
        """A shared durable pull consumer: create (also the filtered form nats-py sends),
        info, fetch, and acks (ack, nak, term, in progress)."""
        c = f"{stream}.{name}"
        return [
            f"{self._p}.CONSUMER.CREATE.{c}",
            f"{self._p}.CONSUMER.CREATE.{c}.>",
            f"{self._p}.CONSUMER.INFO.{c}",
            f"{self._p}.CONSUMER.MSG.NEXT.{c}",
            f"$JS.ACK.{c}.>",
        ]


def users(
    layout: Layout,
    keys: Mapping[Identity, str],
    *,
    supervisor_durable: str = DEFAULT_SUPERVISOR_DURABLE,
    notifier_durable: str = DEFAULT_NOTIFIER_DURABLE,
) -> list[User]:
    """One nkey :class:`User` per identity of ``keys`` (identity -> public key), with its
    :func:`permissions` under ``layout``."""
    return [
        User(
            identity=ident,
            nkey=key,
            permissions=permissions(
                layout,
                ident,
                supervisor_durable=supervisor_durable,
                notifier_durable=notifier_durable,
            ),
        )
        for ident, key in keys.items()
    ]


# -- nats-server configuration ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class User:
    """One user of the server configuration: an nkey (public key ``U...``) or a user name with
    a password hash (bcrypt, as ``nats server passwd`` makes), and its permissions."""

    identity: Identity
    permissions: Permissions
    nkey: str = ""
    """The public nkey (``U...``); no secret."""
    user: str = ""
    password_hash: str = ""
    """bcrypt hash (``$2a$...``) of the password; never the password itself."""

    def __post_init__(self) -> None:
        """Check that exactly one way of authenticating is given.

        Raises:
            ValueError: neither or both of ``nkey`` and ``user``; a user without a bcrypt hash.
        """
        if bool(self.nkey) == bool(self.user):
            raise ValueError(f"user {self.identity}: give either an nkey or a user name")
        if self.nkey and not (self.nkey.startswith("U") and len(self.nkey) == 56):
            raise ValueError(f"user {self.identity}: {self.nkey!r} is not a user nkey (U...)")
        if self.user and not self.password_hash.startswith("$2"):
            raise ValueError(f"user {self.identity}: the password must be a bcrypt hash ($2...)")

    def as_config(self) -> dict[str, Any]:
        entry: dict[str, Any] = (
            {"nkey": self.nkey}
            if self.nkey
            else {"user": self.user, "password": self.password_hash}
        )
        entry["permissions"] = self.permissions.as_config()
        return entry


@dataclass(frozen=True, slots=True)
class TlsBlock:
    """A ``tls`` block: the server's certificate and key, and the CA that signs clients'
    certificates (with ``verify``, every client must present one)."""

    cert_file: str
    key_file: str
    ca_file: str = ""
    verify: bool = False
    """Require a client certificate signed by ``ca_file``."""
    timeout_s: float = 5.0

    def as_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cert_file": self.cert_file, "key_file": self.key_file}
        if self.ca_file:
            out["ca_file"] = self.ca_file
        if self.verify:
            out["verify"] = True
        out["timeout"] = self.timeout_s
        return out


@dataclass(frozen=True, slots=True)
class ClusterBlock:
    """A ``cluster`` block: how this server meets the others of a JetStream cluster.

    Routes are authenticated by TLS with ``verify`` (each server presents a certificate signed
    by the site's CA, and accepts only such): no route password is written anywhere. Without
    ``tls`` the routes are open to whoever reaches ``listen``: only for loopback tests."""

    name: str
    listen: str
    """``host:port`` the routes listen on."""
    routes: tuple[str, ...]
    """``nats-route://host:port`` of every server (its own is ignored by nats-server)."""
    tls: TlsBlock | None = None

    def as_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "listen": self.listen}
        out["routes"] = list(self.routes)
        if self.tls is not None:
            out["tls"] = self.tls.as_config()
        return out


def render_server_config(
    users: Sequence[User],
    *,
    host: str = "127.0.0.1",
    port: int = 4222,
    store_dir: str,
    server_name: str,
    tls: TlsBlock | None = None,
    cluster: ClusterBlock | None = None,
    max_payload: int | None = None,
) -> str:
    """Return a nats-server configuration enforcing ``users``' permissions.

    JetStream on, no anonymous access (no ``no_auth_user``: a connection without credentials
    is refused), HTTP monitoring off (no ``http`` port), and every user with exactly its
    allow lists. The file holds public keys and password hashes only, no secret.

    Args:
        users: every identity that may connect.
        host: the client listen address.
        port: the client port (-1: any free port).
        store_dir: the JetStream store directory.
        server_name: the server's name (unique within a cluster).
        tls: the client TLS block (required TLS), if any.
        cluster: the cluster block, for a JetStream cluster.
        max_payload: the largest message, in bytes (nats-server's default when None).

    Raises:
        ValueError: no user, or two users with one identity.
    """
    if not users:
        raise ValueError("a server without users would refuse everyone")
    names = [str(u.identity) for u in users]
    if len(set(names)) != len(names):
        raise ValueError(
            f"identities given twice: {sorted(n for n in names if names.count(n) > 1)}"
        )
    lines = [
        "# nats-server configuration written by dispatch (dispatch_nats.permissions).",
        "# Users are identified by public nkeys or bcrypt hashes: this file holds no secret.",
        f"server_name: {_q(server_name)}",
        f"host: {_q(host)}",
        f"port: {port}",
    ]
    if max_payload is not None:
        lines.append(f"max_payload: {max_payload}")
    lines.append(f"jetstream: {_block({'store_dir': store_dir})}")
    if tls is not None:
        lines.append(f"tls: {_block(tls.as_config())}")
    if cluster is not None:
        lines.append(f"cluster: {_block(cluster.as_config())}")
    entries = []
    for u in users:
        entries.append(f"    # {u.identity}\n    " + _block(u.as_config(), indent=4))
    lines.append("authorization: {\n  users: [\n" + ",\n".join(entries) + "\n  ]\n}")
    return "\n".join(lines) + "\n"


def _q(value: str) -> str:
    # JSON strings are nats-server config strings; quoted, `$JS...` is not a variable.
    return json.dumps(value)


def _block(value: Any, indent: int = 0) -> str:
    pad = " " * indent
    if isinstance(value, dict):
        items = [f"{pad}  {k}: {_block(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + "\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list):
        if not value:
            return "[]"
        items = [f"{pad}  {_block(v, indent + 2)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return _q(str(value))
