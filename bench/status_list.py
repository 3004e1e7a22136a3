"""``dispatch status`` over many jobs (issue 16 item 7, issue 13's listing speed): the jobs
written with ``tests/browser/many.py`` (the helper of ``bench/web_jobs.py``) behind the API
service alone, then the CLI run as a user runs it (a subprocess), ``--runs`` times each, the
median reported:

* ``first_listing_s``: the first ``dispatch status --limit 50`` after the API started (the
  API's jobs index is built by it);
* ``page_s``: ``dispatch status --limit 50``;
* ``filtered_page_s``: ``dispatch status --state pending --cluster local --limit 50``;
* ``all_s``: ``dispatch status --limit N`` printing every job.

The last line is one JSON object with those. Runs against the checkout it is started from
(``PYTHONPATH=<checkout> python bench/status_list.py``: the API, CLI and helper of that tree).

    python bench/status_list.py --jobs 10000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.*, tests.*

from bench.many_jobs import many_jobs, time_status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with many_jobs(args.jobs, "status-list-") as (many, setup_s):
        first = time_status(many.api, "--limit", "50")
        print(f"first dispatch status --limit 50: {first:.3f}", flush=True)
        page = [time_status(many.api, "--limit", "50") for _ in range(args.runs)]
        print(f"dispatch status --limit 50: {[round(x, 3) for x in page]}", flush=True)
        filtered = [
            time_status(many.api, "--state", "pending", "--cluster", "local", "--limit", "50")
            for _ in range(args.runs)
        ]
        print(f"... --state pending --cluster local: {[round(x, 3) for x in filtered]}")
        everything = [time_status(many.api, "--limit", str(args.jobs)) for _ in range(args.runs)]
        print(f"dispatch status (all jobs): {[round(x, 3) for x in everything]}", flush=True)
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "runs": args.runs,
                "first_listing_s": round(first, 3),
                "page_s": round(statistics.median(page), 3),
                "filtered_page_s": round(statistics.median(filtered), 3),
                "all_s": round(statistics.median(everything), 3),
                "setup_s": round(setup_s, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
