"""The jobs list pages past 1,000 jobs (issue 13), in a real headless Chromium.

1,030 jobs are written directly into the record and status streams (``tests/browser/many.py``
says why and how) behind the API service alone; the page walks to the last page and back.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser.conftest import NewPage
from tests.browser.many import TOKEN, ManyJobs
from tests.browser.support import sign_in

JOBS = 1030
PAGE = 50


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManyJobs]:
    instance = ManyJobs(tmp_path_factory.mktemp("many"), JOBS)
    try:
        instance.start()
        yield instance
    finally:
        instance.stop()


def test_the_jobs_list_pages_past_a_thousand_jobs(many: ManyJobs, new_page: NewPage) -> None:
    ids = many.ids()
    page = new_page(many.api)
    sign_in(page, TOKEN)
    page.wait_for_selector(f"#jobs tr[data-job='{ids[0]}']")
    assert page.inner_text("#page-info") == f"1-{PAGE} of {JOBS}"
    assert page.locator("#jobs tbody tr").count() == PAGE
    assert page.is_disabled("#prev")
    last = JOBS - JOBS % PAGE  # the offset of the last page
    for offset in range(PAGE, last + 1, PAGE):
        page.click("#next")
        page.wait_for_selector(f"#jobs tr[data-job='{ids[offset]}']")
    assert page.inner_text("#page-info") == f"{last + 1}-{JOBS} of {JOBS}"
    assert page.locator("#jobs tbody tr").count() == JOBS % PAGE
    assert page.is_disabled("#next")
    page.click("#prev")
    page.wait_for_selector(f"#jobs tr[data-job='{ids[last - PAGE]}']")
    # Filters and paging together: pending is every job here.
    page.select_option("#f-state", "pending")
    page.wait_for_selector(f"#jobs tr[data-job='{ids[0]}']")
    assert page.inner_text("#page-info") == f"1-{PAGE} of {JOBS}"
    page.select_option("#f-state", "running")
    page.wait_for_selector("#page-info:text('no jobs')")
