"""Checkpoint helper figures (issue 4, "Performance"): latest() by listing, publish latency.

* latest() over 100,000 publications on local disk (target <= 0.15 s on a quiet machine,
  issue 11): the whole of `Checkpoints.latest()`, listing pub/, checking that every name's
  epoch and step can be read and parsing the names that could win; printed beside a bare
  `os.listdir` of the same folder, as a ratio, since a busy machine slows both alike;
* latest() over 5,000 publications on SeaweedFS (`weed mini`, started here on loopback),
  listing every page, with the page count;
* publish latency on local disk: `Checkpoints.publish` (existence check, O_CREAT|O_EXCL,
  fsync of the entry, of pub/ and of the root), median and 90th percentile.

    python bench/ckpt.py [--local 100000] [--s3 5000] [--publishes 200] [--repeats 5]

The last line is one JSON object: {"latest_local_s", "listdir_local_s",
"latest_local_ratio_to_listdir", "latest_local_entries", "latest_local_target_s",
"latest_local_within_target", "latest_s3_s", "latest_s3_entries", "latest_s3_pages",
"publish_median_ms", "publish_p90_ms", "load_1m"}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.servers

from dispatch_ckpt import Checkpoints
from dispatch_ckpt.names import encode_name
from dispatch_ckpt.s3 import S3Store
from dispatch_core.epoch import epoch
from tests.servers.s3 import SeaweedFS

TARGET_S = 0.15
BUCKET = "bench-ckpt"


def names(count: int) -> list[str]:
    """`count` publication names of 10 executions (epochs), steps interleaved."""
    return [
        encode_name(epoch(0, 1 + i % 10, 0), i, f"exec/attempt-{i % 10}/checkpoint-{i}")
        for i in range(count)
    ]


def timed(fn: object, repeats: int) -> list[float]:
    assert callable(fn)
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def bench_local_latest(tmp: Path, count: int, repeats: int) -> tuple[float, float]:
    """Median seconds of `latest()` and of a bare `os.listdir` of the same pub/."""
    root = tmp / "latest-local"
    pub = root / "pub"
    pub.mkdir(parents=True)
    for name in names(count):
        # Created directly (no fsync each): this measures reading, not 100,000 publishes.
        os.close(os.open(pub / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    ckpt = Checkpoints.open(str(root))
    found = ckpt.latest()
    assert found is not None
    assert found.step == count - 1
    # Interleaved, so a burst of load on a shared machine falls on both alike.
    latest_times: list[float] = []
    listdir_times: list[float] = []
    for _ in range(repeats):
        listdir_times += timed(lambda: os.listdir(pub), 1)
        latest_times += timed(ckpt.latest, 1)
    median, bare = statistics.median(latest_times), statistics.median(listdir_times)
    print(
        f"latest() over {count:,} publications on local disk: median {median:.3f} s "
        f"(min {min(latest_times):.3f}, max {max(latest_times):.3f}; target <= {TARGET_S} s, "
        f"{median / TARGET_S:.0%} of it); bare os.listdir of pub/: median {bare:.3f} s; "
        f"ratio {median / bare:.2f}"
    )
    return median, bare


def bench_s3_latest(tmp: Path, count: int, repeats: int) -> tuple[float, int]:
    with SeaweedFS(tmp / "seaweedfs") as server:
        client = server.client(max_pool_connections=16)
        client.create_bucket(Bucket=BUCKET)
        store = S3Store(client, BUCKET, "job")
        start = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(store.create_entry, names(count)))
        filled = time.perf_counter() - start
        ckpt = Checkpoints(store)
        pages = ckpt.listing().pages
        times = timed(ckpt.latest, repeats)
        median = statistics.median(times)
        print(
            f"latest() over {count:,} publications on SeaweedFS: median {median:.3f} s, "
            f"{pages} pages (min {min(times):.3f}, max {max(times):.3f}); "
            f"{count:,} conditional creates took {filled:.1f} s ({count / filled:.0f}/s)"
        )
        return median, pages


def bench_publish(tmp: Path, count: int) -> tuple[float, float]:
    root = tmp / "publish"
    ckpt = Checkpoints.open(str(root), {"DISPATCH_ATTEMPT": "a1", "DISPATCH_EPOCH": "1000000"})
    folder = Path(ckpt.exec_dir())
    saves = []
    for step in range(count):
        (folder / f"step-{step}").mkdir()
        saves.append(str(folder / f"step-{step}"))
    times = []
    for step, path in enumerate(saves):
        start = time.perf_counter()
        ckpt.publish(step, path)
        times.append(time.perf_counter() - start)
    ms = sorted(t * 1000 for t in times)
    median, p90 = statistics.median(ms), ms[int(len(ms) * 0.9)]
    print(f"publish on local disk: median {median:.2f} ms, p90 {p90:.2f} ms ({count} publishes)")
    return median, p90


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", type=int, default=100_000)
    parser.add_argument("--s3", type=int, default=5_000)
    parser.add_argument("--publishes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp_name:
        tmp = Path(tmp_name)
        local, bare = bench_local_latest(tmp, args.local, args.repeats)
        s3, pages = bench_s3_latest(tmp, args.s3, args.repeats)
        median, p90 = bench_publish(tmp, args.publishes)
    print(
        json.dumps(
            {
                "latest_local_s": round(local, 4),
                "listdir_local_s": round(bare, 4),
                "latest_local_ratio_to_listdir": round(local / bare, 3),
                "latest_local_entries": args.local,
                "latest_local_target_s": TARGET_S,
                "latest_local_within_target": local <= TARGET_S,
                "latest_s3_s": round(s3, 4),
                "latest_s3_entries": args.s3,
                "latest_s3_pages": pages,
                "publish_median_ms": round(median, 3),
                "publish_p90_ms": round(p90, 3),
                "load_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
