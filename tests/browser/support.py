"""Helpers of the browser tests: the tokens a ``dispatch up`` gives its API, the page's
sign-in, and the JSON API called directly (to compare what the page shows with it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Final

from playwright.sync_api import Page

from tests.e2e.cli.support import Up, eventually

__all__ = [
    "BOB_TOKEN",
    "SERVICE_TOKEN",
    "WebUp",
    "call",
    "chromium_path",
    "sign_in",
]

SERVICE_TOKEN: Final = "ci-service-token-0123456789abcdef"
"""A service actor's token (``ci``): a service may not abandon."""
BOB_TOKEN: Final = "bob-human-token-0123456789abcdef"
"""A second person's token (``bob``), taken away by :meth:`WebUp.set_tokens` to show an
expired token."""


def chromium_path() -> str:
    """Debian's chromium (``DISPATCH_CHROMIUM`` overrides); fails, never skips, without it."""
    path = os.environ.get("DISPATCH_CHROMIUM") or shutil.which("chromium")
    assert path, (
        "no chromium: install it (scripts/install.sh runs `apt-get install -y chromium`) or "
        "set DISPATCH_CHROMIUM to a Chromium executable"
    )
    return path


def call(
    api: str, token: str, method: str, path: str, body: object | None = None
) -> tuple[int, Any]:
    """Call the JSON API; return the HTTP status and the parsed answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        api + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


class WebUp:
    """A ``dispatch up`` (:class:`~tests.e2e.cli.support.Up`) and the tokens its API knows.

    ``up`` writes its tokens file with its own person's token alone at every start; the tests
    add a service token (and a second person's) to that file and restart the API child, which
    ``up`` brings back as it does any child that exits (the API reads the file at start).
    """

    def __init__(self, up: Up) -> None:
        self.up = up
        self.api = up.api
        self.token = up.token
        tokens = (up.data_dir / "tokens.toml").read_text()
        self._own = tokens
        self.actor = tokens.split('actor = "', 1)[1].split('"', 1)[0]
        """The person ``up``'s own token maps to (the name the record shows)."""

    def set_tokens(self, *, bob: bool) -> None:
        """Give the API ``up``'s own token, :data:`SERVICE_TOKEN` and (``bob``)
        :data:`BOB_TOKEN`; restart the API and wait until it takes them."""
        extra = f'\n[[tokens]]\nactor = "ci"\nkind = "service"\ntoken = "{SERVICE_TOKEN}"\n'
        if bob:
            extra += f'\n[[tokens]]\nactor = "bob"\nkind = "human"\ntoken = "{BOB_TOKEN}"\n'
        (self.up.data_dir / "tokens.toml").write_text(self._own + extra)
        old = self._api_pid()
        os.kill(old, signal.SIGTERM)

        def restarted() -> None:
            assert self._api_pid() != old
            code, _ = call(self.api, SERVICE_TOKEN, "GET", "/ui/api/me")
            assert code == 200
            code, _ = call(self.api, BOB_TOKEN, "GET", "/ui/api/me")
            assert code == (200 if bob else 401)

        eventually(_retrying(restarted), timeout_s=90, interval_s=0.5)

    def _api_pid(self) -> int:
        """The API child of ``up`` (``python -m services.api``)."""
        assert self.up.proc is not None
        parent = self.up.proc.pid
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == parent and b"services.api" in argv:
                return int(entry.name)
        raise AssertionError("no API child of dispatch up")


def _retrying(check: Any) -> Any:
    def wrapped() -> None:
        try:
            check()
        except (OSError, ValueError) as err:
            raise AssertionError(repr(err)) from None

    return wrapped


def sign_in(page: Page, token: str) -> None:
    """Open the page and sign in with ``token``; wait until it shows who is signed in."""
    page.goto("/")
    page.fill("#token", token)
    page.press("#token", "Enter")
    page.wait_for_selector("#whoami:not([hidden])")
