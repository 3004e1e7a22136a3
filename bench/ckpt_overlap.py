"""The overlap harness (seed 004): how often latest() returns an old execution's lineage
after its replacement published, when the old execution stalled mid-publication and
publishes late.

Runs `dispatch_ckpt.overlap.run_trials` for the append-only design on local disk and on
both S3 servers (SeaweedFS and moto, started here on loopback), and for contrast the
check-then-rename design the seed rejects (its figure: 4 lost of 40; append-only: 0 of 40).

    python bench/ckpt_overlap.py [--posix 1000] [--s3 200] [--strawman 200]

The last line is one JSON object: {"append_only": {store: {"trials", "lost", "late",
"seconds"}}, "check_then_rename": {...}, "lost_total_append_only"}.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.servers

from dispatch_ckpt.overlap import Design, OverlapResult, run_trials
from dispatch_ckpt.posix import PosixStore
from dispatch_ckpt.s3 import S3Store
from dispatch_ckpt.store import Store
from tests.servers.s3 import MotoServer, S3Server, SeaweedFS

BUCKET = "bench-overlap"


def report(store: str, result: OverlapResult) -> dict[str, float | int]:
    print(
        f"{result.design.value:>17} on {store:<9}: lost {result.lost} of {result.trials} trials "
        f"(old publication landed after the replacement's in {result.late}); "
        f"{result.seconds:.1f} s"
    )
    return {
        "trials": result.trials,
        "lost": result.lost,
        "late": result.late,
        "seconds": round(result.seconds, 2),
    }


def posix_roots(base: Path) -> Callable[[int], Store]:
    return lambda i: PosixStore(base / f"t{i}")


def s3_roots(server: S3Server, design: Design) -> Callable[[int], Store]:
    client = server.client(max_pool_connections=4)
    return lambda i: S3Store(client, BUCKET, f"{design.value}/t{i}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posix", type=int, default=1000)
    parser.add_argument("--s3", type=int, default=200)
    parser.add_argument("--strawman", type=int, default=200)
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float | int]]] = {
        Design.APPEND_ONLY.value: {},
        Design.CHECK_THEN_RENAME.value: {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-overlap-") as tmp_name:
        tmp = Path(tmp_name)
        for design, trials in (
            (Design.APPEND_ONLY, args.posix),
            (Design.CHECK_THEN_RENAME, args.strawman),
        ):
            result = run_trials(posix_roots(tmp / design.value), trials, design=design)
            results[design.value]["posix"] = report("posix", result)
        for server_type in (SeaweedFS, MotoServer):
            with server_type(tmp / server_type.name) as server:
                server.client().create_bucket(Bucket=BUCKET)
                for design, trials in (
                    (Design.APPEND_ONLY, args.s3),
                    (Design.CHECK_THEN_RENAME, args.strawman // 4),
                ):
                    result = run_trials(s3_roots(server, design), trials, design=design)
                    results[design.value][server.name] = report(server.name, result)
    lost = sum(int(r["lost"]) for r in results[Design.APPEND_ONLY.value].values())
    print(f"append-only: {lost} lost trials in total")
    print(
        json.dumps(
            {
                "append_only": results[Design.APPEND_ONLY.value],
                "check_then_rename": results[Design.CHECK_THEN_RENAME.value],
                "lost_total_append_only": lost,
            }
        )
    )


if __name__ == "__main__":
    main()
