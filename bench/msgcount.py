"""Count a NATS client's messages by what they are (BENCHMARK instrumentation, not for
services): every publish and every message received by the nats-py clients named
``name`` in this process, each labelled by its subject (``append``, ``status-put``,
``ack:<consumer>``, ...) and each reply by the request it answers (``reply:<request>``).

    counter = MessageCounter("dispatch-supervisor")
    with counter.installed():
        ...  # the supervisor runs on this process (a thread of it)
    print(counter.snapshot())

It wraps ``nats.aio.client.Client.publish`` and ``Client._process_msg`` (nats-py 2.x
internals: the one place every outgoing and incoming MSG goes through), so its totals are
what nats-server's ``/connz`` counts as the connection's ``in_msgs`` + ``out_msgs``.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from nats.aio.client import Client

__all__ = ["MessageCounter", "label_of"]


def label_of(subject: str) -> str:
    """What a published subject is (see the module docstring)."""
    tokens = subject.split(".")
    if subject.startswith("$JS.ACK."):
        return f"ack:{tokens[3]}"
    if subject.startswith("$JS.API.CONSUMER.MSG.NEXT."):
        return f"fetch:{tokens[6]}"
    if subject.startswith("$JS.API.DIRECT.GET."):
        return f"direct-get:{tokens[4]}"
    if subject.startswith("$JS.API.STREAM.MSG.GET."):
        return f"leader-get:{tokens[5]}"
    if subject.startswith("$JS.API."):
        return "api:" + ".".join(tokens[2:4])
    for kind in ("record", "status", "work", "discovery"):
        if f".{kind}." in f".{subject}":
            return {"record": "append", "status": "status-put"}.get(kind, f"{kind}-publish")
    return f"other:{tokens[0]}"


class MessageCounter:
    """Messages of the clients named ``name``, by label (module docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self.out: Counter[str] = Counter()
        self.into: Counter[str] = Counter()
        self._replies: dict[str, str] = {}

    def _mine(self, client: Client) -> bool:
        return bool(client.options.get("name") == self._name)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Count while inside (patching the nats-py client class of this process)."""
        publish, process = Client.publish, Client._process_msg
        counter = self

        async def counted_publish(
            client: Client, subject: str, payload: bytes = b"", reply: str = "", headers: Any = None
        ) -> None:
            if counter._mine(client):
                label = label_of(subject)
                with counter._lock:
                    counter.out[label] += 1
                    if reply:
                        counter._replies[reply] = label
            await publish(client, subject, payload, reply, headers)

        async def counted_process(
            client: Client, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
        ) -> None:
            if counter._mine(client):
                subj = subject.decode()
                with counter._lock:
                    label = counter._replies.get(subj)
                    if label is not None:
                        counter.into[f"reply:{label}"] += 1
                    elif reply.startswith(b"$JS.ACK."):
                        tokens = reply.decode().split(".")
                        consumer = tokens[3]
                        if consumer.startswith("ordered-"):  # a random name
                            consumer = f"{tokens[2]}/ordered"
                        counter.into[f"deliver:{consumer}"] += 1
                    else:
                        counter.into[f"other-in:{label_of(subj)}"] += 1
            await process(client, sid, subject, reply, data, headers)

        Client.publish = counted_publish  # type: ignore[method-assign,assignment]
        Client._process_msg = counted_process  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            Client.publish = publish  # type: ignore[method-assign]
            Client._process_msg = process  # type: ignore[method-assign]

    def snapshot(self) -> dict[str, int]:
        """Every label so far, ``out:`` or ``in:`` prefixed."""
        with self._lock:
            return {
                **{f"out:{k}": v for k, v in self.out.items()},
                **{f"in:{k}": v for k, v in self.into.items()},
            }
