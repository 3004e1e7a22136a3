"""The kubeflow backend's log reading, pure parts: which pod is the trainer's node 0, and a
log read as its first B + limit + 1 bytes turned into a bounded chunk from offset B."""

from __future__ import annotations

from typing import Any

from dispatch_backends.kubeflow.logs import log_chunk, trainer_pod


def _pod(name: str, *, rj: str = "node", index: str = "0", restart: str = "0", **extra: str) -> Any:
    labels = {
        "jobset.sigs.k8s.io/replicatedjob-name": rj,
        "batch.kubernetes.io/job-completion-index": index,
        "jobset.sigs.k8s.io/restart-attempt": restart,
        **extra,
    }
    return {
        "metadata": {"name": name, "labels": labels, "creationTimestamp": "2026-01-01T00:00:00Z"}
    }


def test_node_0_of_the_trainer_of_the_latest_restart_is_read() -> None:
    pods = [
        _pod("init-0", rj="dataset-initializer"),
        _pod("node-1", index="1", restart="1"),
        _pod("node-0-r0"),
        _pod("node-0-r1", restart="1"),
        _pod("other-job-index", **{"jobset.sigs.k8s.io/job-index": "1"}),
    ]
    chosen = trainer_pod(pods, "node")
    assert chosen is not None
    assert chosen["metadata"]["name"] == "node-0-r1"
    assert trainer_pod([_pod("init-0", rj="dataset-initializer")], "node") is None


def test_a_log_is_cut_to_the_window_and_says_whether_more_is_there() -> None:
    # asked 3 + 4 + 1 = 8 bytes and got them all: more is there
    more = log_chunk(b"abcdefgh", 3, 4, asked=8, live=False, where="pod ns/p")
    assert (more.data, more.offset, more.next_offset) == (b"defg", 3, 7)
    assert more.size > more.next_offset
    assert not more.complete
    # got fewer than asked: that is the whole log
    whole = log_chunk(b"abcde", 3, 4, asked=8, live=False, where="pod ns/p")
    assert (whole.data, whole.size) == (b"de", 5)
    assert whole.complete
    past = log_chunk(b"ab", 5, 4, asked=10, live=True, where="pod ns/p")
    assert (past.data, past.offset, past.size, past.live) == (b"", 5, 5, True)
