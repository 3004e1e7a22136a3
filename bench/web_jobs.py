"""The web page's jobs list with many jobs: the first page rendered in a real headless
Chromium, side by side with ``dispatch status`` listing the same jobs (issue 13: under 1 s
with 10,000 jobs on this machine).

There is no fast way to submit 10,000 jobs (each would start a process on the local
backend), so the jobs are written directly through the library the tests use
(``tests/browser/many.py``: each job's ``JobCreated`` record and its projected Status) into a
private nats-server, with the API service alone in front (no supervisor: the jobs stay
pending).

Measured, ``--runs`` times each, the median reported:

* ``web_first_page_s``: from ``page.goto("/")`` (token already in the tab's session) until
  the jobs table holds its first page (50 rows) in the browser;
* ``web_api_page_s``: ``GET /ui/api/jobs?limit=50`` alone (the server's share);
* ``status_first_page_s``: ``dispatch status --limit 50`` (a subprocess, as a user runs it);
* ``status_all_s``: ``dispatch status --limit N`` printing every job.

    python bench/web_jobs.py [--jobs 10000] [--runs 5]

The last line is one JSON object with those, the ratios ``web_vs_status_first_page`` and
``web_vs_status_all``, and ``ok`` (``web_first_page_s`` under 1 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.*, tests.*

from playwright.sync_api import sync_playwright

from bench.many_jobs import TOKEN, many_jobs, time_status
from tests.browser.support import chromium_path

PAGE = 50


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def _api_page(api: str) -> float:
    request = urllib.request.Request(
        f"{api}/ui/api/jobs?limit={PAGE}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    return time.monotonic() - started


def _web_first_page(api: str, runs: int) -> list[float]:
    out: list[float] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            for _ in range(runs):
                context = browser.new_context(base_url=api, bypass_csp=True)
                page = context.new_page()
                page.add_init_script(f"sessionStorage.setItem('dispatch.token', {TOKEN!r})")
                started = time.monotonic()
                page.goto("/")
                page.wait_for_function(
                    f"document.querySelectorAll('#jobs tbody tr').length === {PAGE}",
                    timeout=120_000,
                )
                out.append(time.monotonic() - started)
                context.close()
        finally:
            browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with many_jobs(args.jobs, "web-jobs-") as (many, setup_s):
        _api_page(many.api)  # warm the API's caches as a running service has them
        api = [_api_page(many.api) for _ in range(args.runs)]
        print(f"GET /ui/api/jobs (first page): {[round(x, 3) for x in api]}", flush=True)
        web = _web_first_page(many.api, args.runs)
        print(f"browser, first page rendered: {[round(x, 3) for x in web]}", flush=True)
        first = [time_status(many.api, "--limit", str(PAGE)) for _ in range(args.runs)]
        print(f"dispatch status --limit {PAGE}: {[round(x, 3) for x in first]}", flush=True)
        all_runs = max(1, args.runs // 2)
        everything = [time_status(many.api, "--limit", str(args.jobs)) for _ in range(all_runs)]
        print(f"dispatch status (all jobs): {[round(x, 3) for x in everything]}", flush=True)
    result = {
        "jobs": args.jobs,
        "runs": args.runs,
        "web_first_page_s": _median(web),
        "web_api_page_s": _median(api),
        "status_first_page_s": _median(first),
        "status_all_s": _median(everything),
        "web_vs_status_first_page": round(_median(web) / _median(first), 2),
        "web_vs_status_all": round(_median(web) / _median(everything), 2),
        "setup_s": round(setup_s, 1),
        "target_s": 1.0,
        "ok": _median(web) < 1.0,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
