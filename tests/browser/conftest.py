"""Fixtures of the web page's browser tests: a real ``dispatch up`` (local backend, fault
injection) with two more tokens, and a real headless Chromium (Debian's ``chromium``, driven
by Playwright from PyPI; Playwright's own browser downloads are never used).

Every page a test opens records every request it makes and every console message; at the
end of the test the page must have asked nothing outside the API's origin, thrown nothing,
and logged no console error (but the HTTP refusals a test provokes on purpose, which
Chromium logs as "Failed to load resource").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, sync_playwright

from tests.browser.support import WebUp, chromium_path
from tests.e2e.cli.support import Up

NewPage = Callable[..., Page]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebUp]:
    """A ``dispatch up`` whose API also knows a service token and a second person's."""
    instance = Up(tmp_path_factory.mktemp("web") / "data")
    instance.start()
    try:
        web = WebUp(instance)
        web.set_tokens(bob=True)
        yield web
    finally:
        instance.close()


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    """Playwright's sync API, per test module. Its event loop runs in the main thread while
    it is open, so every later test's ``asyncio.run`` would fail ("cannot be called from a
    running event loop"): a session-wide instance broke every test after the browser's."""
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """Headless Chromium from the machine (``chromium``; ``DISPATCH_CHROMIUM`` overrides)."""
    instance = playwright.chromium.launch(
        executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"]
    )
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the tests save screenshots: ``DISPATCH_WEB_SCREENSHOTS`` or a temporary
    directory (printed at the end of the run by pytest's ``-ra`` summary of tmp paths)."""
    where = os.environ.get("DISPATCH_WEB_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def new_page(browser: Browser) -> Iterator[NewPage]:
    """Open pages whose requests and console are checked when the test ends (module
    docstring): ``new_page(origin, width=..., allowed=(409,), reconnects=True)`` lets the
    page's console show those HTTP statuses, and (``reconnects``) the refused connections
    of a test that restarts the API."""
    checks: list[Callable[[], None]] = []
    contexts = []

    def make(
        origin: str,
        *,
        width: int = 1280,
        height: int = 900,
        allowed: tuple[int, ...] = (),
        reconnects: bool = False,
    ) -> Page:
        context = browser.new_context(
            viewport={"width": width, "height": height},
            base_url=origin,
            # Playwright's wait_for_function evaluates strings in the page, which the page's
            # Content-Security-Policy (script-src 'self') forbids; the requests are recorded
            # and checked below instead, and test_web checks the header itself.
            bypass_csp=True,
        )
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(30_000)
        requests: list[str] = []
        errors: list[str] = []
        thrown: list[str] = []
        page.on("request", lambda r: requests.append(r.url))

        def on_console(msg: ConsoleMessage) -> None:
            if msg.type != "error":
                return
            text = msg.text
            if "Failed to load resource" in text and (
                any(f"status of {s}" in text for s in allowed)
                or (reconnects and "ERR_CONNECTION_REFUSED" in text)
            ):
                return
            errors.append(text)

        page.on("console", on_console)
        page.on("pageerror", lambda e: thrown.append(str(e)))

        def check() -> None:
            outside = [u for u in requests if not u.startswith(origin + "/")]
            assert not outside, f"requests outside {origin}: {outside}"
            assert requests, "the page made no request at all"
            assert not thrown, f"the page threw: {thrown}"
            assert not errors, f"console errors: {errors}"

        checks.append(check)
        return page

    yield make
    try:
        for check in checks:
            check()
    finally:
        for context in contexts:
            context.close()
