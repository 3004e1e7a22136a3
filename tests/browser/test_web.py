"""The operator's web page in a real headless Chromium against a real ``dispatch up`` (local
backend, fault injection): issue 13's Tests section.

Each test opens its own page(s) through the ``new_page`` fixture, which fails the test when a
page asks anything outside the API's origin, throws, or logs a console error.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from playwright.sync_api import Page

from tests.browser.conftest import NewPage
from tests.browser.support import BOB_TOKEN, SERVICE_TOKEN, WebUp, call, sign_in
from tests.e2e.cli.support import eventually

WAIT_FOR_FLAG = 'while [ ! -e "$FLAG" ]; do sleep 0.1; done'
FAIL_ONCE = 'if [ -e "$FLAG.ran" ]; then ' + WAIT_FOR_FLAG + '; else touch "$FLAG.ran"; exit 3; fi'
"""Exits 3 the first time, then runs until ``$FLAG`` exists (a resubmission runs)."""


def _job_file_toml(name: str, script: str, flag: Path, rules: list[dict[str, Any]]) -> str:
    lines = [
        f"name = {json.dumps(name)}",
        "",
        "[spec]",
        'cluster = "local"',
        f"command = {json.dumps(['/bin/sh', '-c', script])}",
        f"env = {{ FLAG = {json.dumps(str(flag))} }}",
    ]
    for rule in rules:
        lines += ["", "[[policy.rules]]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in rule.items()]
    return "\n".join(lines) + "\n"


def _submit(
    up: WebUp,
    name: str,
    script: str,
    flag: Path,
    rules: list[dict[str, Any]],
    checkpoint: str | None = None,
    job_id: str | None = None,
) -> str:
    spec: dict[str, Any] = {
        "cluster": "local",
        "command": ["/bin/sh", "-c", script],
        "env": {"FLAG": str(flag)},
    }
    if checkpoint is not None:
        spec["checkpoint"] = checkpoint
    body: dict[str, Any] = {"name": name, "spec": spec, "policy": {"rules": rules}}
    if job_id is not None:
        body["job_id"] = job_id
    code, answer = call(up.api, up.token, "POST", "/v1/jobs", body)
    assert code == 201, answer
    return str(answer["job_id"])


def _open(page: Page, hash_: str) -> None:
    page.evaluate(f"location.hash = {json.dumps(hash_)}")


def _inbox_ids(up: WebUp, job_id: str) -> list[str]:
    code, inbox = call(up.api, up.token, "GET", f"/ui/api/inbox?job={job_id}")
    assert code == 200, inbox
    return [str(i["id"]) for i in inbox["items"]]


def _answered_in(page: Page, item: str) -> None:
    """Wait until the inbox item ``item`` (a CSS selector) says its answer was taken, or has
    left the inbox already (the inbox reloads when the job changes)."""
    page.wait_for_function(
        f"""() => {{
            const item = document.querySelector({json.dumps(item)});
            if (!item) return true;
            const result = item.querySelector('.answer-result');
            if (result && result.classList.contains('refused')) {{
                throw new Error('refused: ' + result.textContent);
            }}
            return !!(result && result.classList.contains('ok'));
        }}""",
        timeout=60_000,
    )


def _answers_become(page: Page, selector: str, answers: list[str]) -> None:
    """Wait until the inbox item(s) at ``selector`` offer exactly ``answers``. The inbox
    renders again whenever its change stream (re)connects, so its buttons are read in the
    page, in one go, rather than from a list being replaced under the test."""
    page.wait_for_function(
        "([sel, want]) => JSON.stringify([...document.querySelectorAll(sel + ' button')]"
        ".map(b => b.dataset.answer)) === want",
        arg=[selector, json.dumps(answers, separators=(",", ":"))],
        timeout=30_000,
    )


def test_sign_in_shows_the_actor_the_token_maps_to(up: WebUp, new_page: NewPage) -> None:
    page = new_page(up.api)
    sign_in(page, up.token)
    assert page.inner_text("#whoami") == f"signed in as {up.actor} (human)"
    # The token is the tab's, and never part of a URL.
    assert page.evaluate("sessionStorage.getItem('dispatch.token')") == up.token
    assert up.token not in page.url
    page.wait_for_selector("#jobs")


def test_a_job_submitted_from_the_page_shows_its_plan_and_a_preemption_live(
    up: WebUp, new_page: NewPage, tmp_path: Path, screenshots: Path
) -> None:
    """Submit from the page: the plan (uncovered causes) before confirming; then preempting
    the job (fault injection) shows ``recovering`` then ``running`` without a reload."""
    page = new_page(up.api)
    sign_in(page, up.token)
    page.click("#nav-submit")
    rules = [
        {"on": ["preempted", "node-lost"], "action": "resubmit", "budget": 3},
        {
            "on": ["no-capacity"],
            "action": "resubmit",
            "budget": 2,
            "clusters": ["local"],
            "wait_s": 900,
        },
    ]
    page.fill("#jobfile", _job_file_toml("webtrain", WAIT_FOR_FLAG, tmp_path / "flag", rules))
    page.click("#preview")
    uncovered = page.inner_text("#uncovered")
    assert "non-zero-exit" in uncovered
    assert "preempted" not in uncovered
    assert "node-lost" not in uncovered
    assert "resubmit" in page.inner_text("#plan")
    # Failover and the no-capacity wait, as the CLI's plan says them (issue 14 part 2).
    assert (
        "resubmit on no-capacity (budget 2) (fail over: local) "
        "(no capacity for 15 min: stop and apply)"
    ) in page.inner_text("#plan")
    page.click("#confirm-submit")
    page.wait_for_url(re.compile(r"#/job/webtrain-[a-z2-7]{8}$"))
    job_id = page.url.rsplit("/", 1)[1]
    assert "non-zero-exit" in page.inner_text("#uncovered")  # the job's own plan
    page.wait_for_function(
        "document.getElementById('job-state')?.textContent === 'running'", timeout=90_000
    )
    page.evaluate(
        """() => {
            window.__marker = 'no reload';
            window.__seen = [document.getElementById('job-state').textContent];
            new MutationObserver(() => {
                const s = document.getElementById('job-state');
                if (s && window.__seen[window.__seen.length - 1] !== s.textContent) {
                    window.__seen.push(s.textContent);
                }
            }).observe(document.getElementById('job-status'), {childList: true, subtree: true});
        }"""
    )
    first = up.up.object_id(job_id)
    up.up.faults.preempt(first)
    page.wait_for_function(
        """() => {
            const seen = window.__seen, i = seen.indexOf('recovering');
            return i >= 0 && seen.slice(i + 1).includes('running');
        }""",
        timeout=120_000,
    )
    assert page.evaluate("window.__marker") == "no reload"
    assert page.inner_text("#job-cause") in ("none", "preempted")
    page.wait_for_function(
        "document.getElementById('history').textContent.includes('preempted')", timeout=60_000
    )
    page.screenshot(path=str(screenshots / "job.png"), full_page=True)
    (tmp_path / "flag").touch()


def test_a_held_job_is_answered_from_the_inbox(
    up: WebUp, new_page: NewPage, tmp_path: Path, screenshots: Path
) -> None:
    """A hold rule's job appears in the inbox; release is refused with the core's reason;
    resubmit from the page runs it again; the record names the person of the token."""
    job_id = _submit(
        up, "webhold", FAIL_ONCE, tmp_path / "flag", [{"on": ["non-zero-exit"], "action": "hold"}]
    )
    up.up.wait_status(job_id, lambda s: s["state"] == "held", timeout_s=90)
    page = new_page(up.api, allowed=(409,))
    sign_in(page, up.token)
    page.click("#nav-inbox")
    item = page.locator(f"li.item[data-job='{job_id}']")
    item.wait_for()
    assert "resubmit, cancel or give up" in item.inner_text()
    # A recovery hold's answers (the core's hold_answers): release can't lift it, so it is
    # not offered; forced, it is refused with the core's reason.
    _answers_become(page, f"li.item[data-job='{job_id}']", ["resubmit", "cancel", "give-up"])
    page.screenshot(path=str(screenshots / "inbox.png"), full_page=True)

    code, refusal = call(up.api, up.token, "POST", f"/v1/jobs/{job_id}/release", {"reason": "x"})
    assert code == 409, refusal
    page.evaluate(f"dispatchPage.give({json.dumps(job_id)}, 'release', 'the data is fixed')")
    refused = page.locator("#answer-result.refused")
    refused.wait_for()
    assert refusal["error"]["message"] in refused.inner_text()

    page.locator(f"li.item[data-job='{job_id}'] button[data-answer=resubmit]").click()
    page.fill("#confirm-reason", "retry after fixing the input path")
    page.click("#confirm-ok")
    page.locator(f"li.item[data-job='{job_id}'] .answer-result.ok").wait_for()
    up.up.wait_status(job_id, lambda s: s["state"] == "running", timeout_s=90)

    _open(page, f"#/job/{job_id}")
    page.wait_for_function(
        "document.getElementById('job-state')?.textContent === 'running'", timeout=60_000
    )
    # The hold rule as the CLI's plan says it, not a budget it doesn't have.
    assert "hold on non-zero-exit (overdue after 24 h)" in page.inner_text("#plan")
    assert "budget" not in page.inner_text("#plan")
    page.locator("#commands button").first.wait_for()
    assert _commands(page) == ["hold", "cancel", "emergency-stop"]
    page.click("#record summary")
    events = page.inner_text("#events")
    assert "retry after fixing the input path" in events
    assert f'"name":"{up.actor}","kind":"human"' in events
    (tmp_path / "flag").touch()


def test_abandon_is_offered_to_a_person_only_and_refused_if_a_service_forces_it(
    up: WebUp, new_page: NewPage, tmp_path: Path
) -> None:
    """Abandon is offered only while an escalation asks for it (here ``foreign:``: the
    core's job_commands), and then to a person only."""
    job_id = _submit(up, "webabandon", WAIT_FOR_FLAG, tmp_path / "flag", [])
    up.up.wait_status(job_id, lambda s: s["state"] == "running", timeout_s=90)

    person = new_page(up.api)
    sign_in(person, BOB_TOKEN)
    _open(person, f"#/job/{job_id}")
    person.locator("#commands button").first.wait_for()
    assert _commands(person) == ["hold", "cancel", "emergency-stop"]  # nothing to abandon
    assert person.inner_text("#history") == "none yet"  # no transition committed yet

    foreign = up.up.faults.foreign(job_id)
    eventually(lambda: _assert_in(f"foreign:{foreign}", _inbox_ids(up, job_id)), timeout_s=90)
    person.locator("#commands button[data-answer=abandon]").wait_for()

    service = new_page(up.api, allowed=(403, 409))
    sign_in(service, SERVICE_TOKEN)
    assert service.inner_text("#whoami") == "signed in as ci (service)"
    _open(service, f"#/job/{job_id}")
    service.locator("#commands button[data-answer=cancel]").wait_for()
    assert service.locator("button[data-answer=abandon]").count() == 0

    code, refusal = call(
        up.api,
        SERVICE_TOKEN,
        "POST",
        f"/v1/jobs/{job_id}/abandon",
        {"reason": "forced", "target": {"submission": 1}},
    )
    assert code in (403, 409), refusal
    service.evaluate(
        f"dispatchPage.give({json.dumps(job_id)}, 'abandon', 'forced', "
        "{target: {submission: 1}})"
    )
    refused = service.locator("#answer-result.refused")
    refused.wait_for()
    assert refusal["error"]["message"] in refused.inner_text()
    (tmp_path / "flag").touch()


def test_a_foreign_object_is_abandoned_from_the_inbox_by_a_person(
    up: WebUp, new_page: NewPage, tmp_path: Path
) -> None:
    """An object named for the job that isn't dispatch's (fault injection) escalates
    ``foreign:<id>``; the inbox offers a person ``abandon`` with that object as its target;
    answered, the record shows the abandon by the person of the token, and the escalation
    leaves the inbox (the core's ``escalation_open``: that object was abandoned)."""
    job_id = _submit(up, "webforeign", WAIT_FOR_FLAG, tmp_path / "flag", [])
    up.up.wait_status(job_id, lambda s: s["state"] == "running", timeout_s=90)
    foreign = up.up.faults.foreign(job_id)
    esc = f"foreign:{foreign}"
    eventually(lambda: _assert_in(esc, _inbox_ids(up, job_id)), timeout_s=90)

    page = new_page(up.api)
    sign_in(page, up.token)
    page.click("#nav-inbox")
    selector = f"li.item[data-job='{job_id}'][data-esc='{esc}']"
    item = page.locator(selector)
    item.wait_for()
    assert "isn't dispatch's" in item.inner_text()  # the core's meaning of foreign:
    _answers_become(page, selector, ["abandon"])

    up.up.faults.preempt(foreign)  # seed 002: "stop it on the scheduler yourself"
    item.locator("button[data-answer=abandon]").click()
    page.fill("#confirm-reason", "a site plugin's object, stopped by hand")
    page.click("#confirm-ok")
    _answered_in(page, selector)
    eventually(lambda: _assert_not_in(esc, _inbox_ids(up, job_id)), timeout_s=60)

    _open(page, f"#/job/{job_id}")
    page.wait_for_selector("#events", state="attached")
    page.click("#record summary")  # the record is collapsed until asked for
    row = page.locator("#events tr", has_text="abandoned").first
    row.wait_for()
    text = row.inner_text()
    assert "a site plugin's object, stopped by hand" in text
    assert f'"name":"{up.actor}","kind":"human"' in text
    assert f'"id":"{foreign}"' in text
    page.wait_for_function(
        f"!document.querySelector(\"#job-escalations [data-esc='{esc}']\")", timeout=30_000
    )
    (tmp_path / "flag").touch()


def test_a_failed_job_shows_what_ran_and_is_superseded_from_the_inbox(
    up: WebUp, new_page: NewPage, tmp_path: Path
) -> None:
    """A job page shows the cause with its provenance and verbatim detail, each execution
    with its epoch, and the checkpoint root; the failure's ``failed:`` escalation is answered
    by ``supersede`` from the inbox, and the two jobs link to each other."""
    job_id = _submit(
        up, "webfail", "exit 3", tmp_path / "flag", [], checkpoint=str(tmp_path / "ck" / "{job}")
    )
    up.up.wait_status(job_id, lambda s: s["settled"], timeout_s=90)
    page = new_page(up.api)
    sign_in(page, up.token)
    _open(page, f"#/job/{job_id}")
    page.wait_for_function(
        "document.getElementById('job-state')?.textContent === 'failed'", timeout=60_000
    )
    assert page.inner_text("#job-cause") == "non-zero-exit"
    assert page.inner_text("#job-provenance") == "application"
    assert page.inner_text("#job-detail") == "exit code 3"
    assert page.eval_on_selector("#job-detail", "e => getComputedStyle(e).whiteSpace") == (
        "pre-wrap"
    ), "the detail is shown verbatim"
    assert page.inner_text("#checkpoint-root") == str(tmp_path / "ck" / job_id)
    ends = page.inner_text("#executions td.ends")
    assert "R0, epoch 1000000: non-zero-exit" in ends, ends  # G=0, N=1, R=0 (seed 004)

    page.click("#nav-inbox")
    selector = f"li.item[data-job='{job_id}'][data-esc='failed:non-zero-exit']"
    item = page.locator(selector)
    _answers_become(page, selector, ["supersede"])
    item.locator("button[data-answer=supersede]").click()
    page.fill("#confirm-reason", "fixed the exit code")
    page.click("#confirm-ok")
    done = item.locator(".answer-result.ok")
    done.wait_for()
    found = re.search(rf"new job ({job_id}-[a-z2-7]{{8}})$", done.inner_text())
    assert found, done.inner_text()
    new_job = found.group(1)
    eventually(lambda: _assert_not_in("failed:non-zero-exit", _inbox_ids(up, job_id)))

    _open(page, f"#/job/{new_job}")
    link = page.locator("#supersedes")
    link.wait_for()
    assert link.inner_text() == job_id
    assert page.inner_text("#checkpoint-root") == str(tmp_path / "ck" / job_id)
    link.click()
    page.wait_for_url(re.compile(f"#/job/{job_id}$"))
    back = page.locator("#superseded-by")
    back.wait_for()
    assert back.inner_text() == new_job


def _commands(page: Page) -> list[str | None]:
    return [b.get_attribute("data-answer") for b in page.locator("#commands button").all()]


def _assert_in(needle: str, haystack: list[str]) -> None:
    assert needle in haystack, haystack


def _assert_not_in(needle: str, haystack: list[str]) -> None:
    assert needle not in haystack, haystack


def test_jobs_list_filters_by_state_cluster_and_needs_a_person_and_shows_changes_live(
    up: WebUp, new_page: NewPage, tmp_path: Path, screenshots: Path
) -> None:
    held = _submit(
        up, "webneeds", "exit 3", tmp_path / "flag1", [{"on": ["non-zero-exit"], "action": "hold"}]
    )
    running = _submit(up, "webrun", WAIT_FOR_FLAG, tmp_path / "flag2", [])
    up.up.wait_status(held, lambda s: s["state"] == "held", timeout_s=90)
    up.up.wait_status(running, lambda s: s["state"] == "running", timeout_s=90)
    page = new_page(up.api)
    sign_in(page, up.token)
    row = page.locator(f"#jobs tr[data-job='{running}']")
    row.wait_for()
    assert row.locator(".c-state").inner_text() == "running"
    assert "local" in row.inner_text()
    page.screenshot(path=str(screenshots / "jobs.png"), full_page=True)

    page.check("#f-needs")
    page.locator(f"#jobs tr[data-job='{held}']").wait_for()
    page.wait_for_function(
        f"!document.querySelector(\"#jobs tr[data-job='{running}']\")", timeout=30_000
    )
    assert "held:1" in page.inner_text(f"#jobs tr[data-job='{held}']")
    page.uncheck("#f-needs")
    page.select_option("#f-state", "running")
    page.wait_for_function(
        f"!document.querySelector(\"#jobs tr[data-job='{held}']\")", timeout=30_000
    )
    states = page.locator("#jobs .c-state").all_inner_texts()
    assert states
    assert set(states) == {"running"}
    page.select_option("#f-state", "")
    page.select_option("#f-cluster", "local")
    page.locator(f"#jobs tr[data-job='{held}']").wait_for()

    # Live: the running job ends (its flag) and the row says so without a reload.
    page.select_option("#f-cluster", "")
    page.locator(f"#jobs tr[data-job='{running}']").wait_for()
    page.evaluate("window.__marker = 'no reload'")
    (tmp_path / "flag2").touch()
    page.wait_for_function(
        f"document.querySelector(\"#jobs tr[data-job='{running}'] .c-state\")?.textContent"
        " === 'succeeded'",
        timeout=90_000,
    )
    assert page.evaluate("window.__marker") == "no reload"


def test_the_page_works_at_phone_width(up: WebUp, new_page: NewPage, screenshots: Path) -> None:
    page = new_page(up.api, width=390, height=844)
    sign_in(page, up.token)
    page.wait_for_selector("#jobs tbody tr")
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the page scrolls sideways at phone width: {width}"
    page.screenshot(path=str(screenshots / "jobs-phone.png"), full_page=True)
    page.click("#nav-inbox")
    page.wait_for_selector("#inbox-items, #inbox-empty")
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the inbox scrolls sideways at phone width: {width}"
    # Keyboard: the first job link is reachable with Tab and opens with Enter.
    page.click("#nav-jobs")
    link = page.locator("#jobs tbody tr a").first
    link.focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("#job-state")


def test_a_long_job_id_at_phone_width_and_a_settled_job_page(
    up: WebUp, new_page: NewPage, tmp_path: Path
) -> None:
    """At 390 px a 63-character job id wraps (no sideways scroll, the list still shows each
    row's state); a succeeded job offers supersede alone; History shows times as the CLI
    does (the ISO time on hover); a job without rules says every cause is uncovered; an
    unknown job shows the notice alone."""
    long_id = "w" * 50 + "-long-id-1234"
    assert len(long_id) == 63
    job_id = _submit(up, "weblong", "true", tmp_path / "flag", [], job_id=long_id)
    up.up.wait_status(job_id, lambda s: s["settled"], timeout_s=90)
    page = new_page(up.api, width=390, height=844, allowed=(404,))
    sign_in(page, up.token)
    state = page.locator(f"#jobs tr[data-job='{job_id}'] .c-state")
    state.wait_for()
    box = state.bounding_box()
    assert box is not None
    assert box["x"] + box["width"] <= 390, f"the state column is off screen: {box}"
    wrap = page.eval_on_selector(".table-wrap", "e => [e.scrollWidth, e.clientWidth]")
    assert wrap[0] <= wrap[1], f"the jobs list scrolls sideways: {wrap}"

    _open(page, f"#/job/{job_id}")
    page.wait_for_function(
        "document.getElementById('job-state')?.textContent === 'succeeded'", timeout=60_000
    )
    page.locator("#commands button").first.wait_for()
    assert _commands(page) == ["supersede"]
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the job page scrolls sideways at phone width: {width}"
    at = page.locator("#history td.c-at time").first
    assert re.fullmatch(r"\d\d:\d\d:\d\d", at.inner_text()), at.inner_text()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT[\d:.]+(Z|[+-]\d\d:\d\d)", at.get_attribute("title") or ""
    )
    assert page.inner_text("#no-rules") == "no rules: every cause is uncovered"

    _open(page, "#/job/nope-123")
    page.locator("#notice:not([hidden])").wait_for()
    assert "nope-123" in page.inner_text("#notice")
    assert page.locator("#view").is_hidden()
    assert page.locator("#job-status").count() == 0


def test_an_edit_after_the_preview_disables_submit(up: WebUp, new_page: NewPage) -> None:
    """Submit sends what was previewed: editing the file takes the preview back."""
    page = new_page(up.api)
    sign_in(page, up.token)
    page.click("#nav-submit")
    page.fill("#jobfile", '[spec]\ncluster = "local"\ncommand = ["true"]\n')
    page.click("#preview")
    page.wait_for_selector("#confirm-submit:not([disabled])")
    page.locator("#jobfile").press("End")
    page.keyboard.type("# edited\n")
    assert page.locator("#confirm-submit").is_disabled()


def test_the_jobs_list_reloads_when_its_change_stream_comes_back(
    up: WebUp, new_page: NewPage, tmp_path: Path
) -> None:
    """What changes while the list's change stream is down (the API restarting) shows once it
    is back: the stream sends only what changes next, so the page reloads the list on each
    (re)connect; meanwhile it says it is reconnecting, and it backs off a stream that opens
    and drops at once."""
    running = _submit(up, "webstale", WAIT_FOR_FLAG, tmp_path / "flag", [])
    up.up.wait_status(running, lambda s: s["state"] == "running", timeout_s=90)
    page = new_page(up.api, reconnects=True)
    sign_in(page, up.token)
    state = f"#jobs tr[data-job='{running}'] .c-state"
    page.wait_for_function(
        f"document.querySelector({json.dumps(state)})?.textContent === 'running'",
        timeout=60_000,
    )
    assert page.locator("#reconnecting").is_hidden()
    mode = {"how": "refuse"}
    opened: list[float] = []

    def changes(route: Any) -> None:
        if mode["how"] == "refuse":
            route.abort("connectionrefused")
        else:  # a stream that opens (200) and drops at once
            opened.append(time.monotonic())
            route.fulfill(status=200, content_type="text/event-stream", body=": live\n\n")

    page.route("**/ui/api/changes", changes)
    up.set_tokens(bob=True)  # restarts the API: the page's stream drops and can't come back
    page.locator("#reconnecting").wait_for()
    (tmp_path / "flag").touch()
    up.up.wait_status(running, lambda s: s["state"] == "succeeded", timeout_s=90)
    late = _submit(up, "weblate", "true", tmp_path / "flag2", [])
    assert page.inner_text(state) == "running"  # nothing told the page yet

    mode["how"] = "drop"
    deadline = time.monotonic() + 30
    while not opened and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert opened, "the page never came back to the change stream"
    first = len(opened)
    page.wait_for_timeout(6_000)  # at 0.5 s a time this would be a dozen
    again = len(opened) - first
    assert again <= 3, f"a stream that opens and drops was retried {again} times in 6 s"

    page.unroute("**/ui/api/changes")
    page.wait_for_function(
        f"document.querySelector({json.dumps(state)})?.textContent === 'succeeded'",
        timeout=60_000,
    )
    page.locator(f"#jobs tr[data-job='{late}']").wait_for()
    page.locator("#reconnecting").wait_for(state="hidden", timeout=60_000)


def test_a_wrong_or_expired_token_is_told_so(up: WebUp, new_page: NewPage) -> None:
    """A wrong token is refused at sign-in; a token the API stops taking (expired, revoked)
    signs the page out with a message saying so. Runs last: it takes bob's token away."""
    page = new_page(up.api, allowed=(401,), reconnects=True)
    page.goto("/")
    page.fill("#token", "not-a-token")
    page.press("#token", "Enter")
    error = page.locator("#signin-error")
    error.wait_for()
    assert "That token is not valid" in error.inner_text()
    assert "the bearer token is not valid" in error.inner_text()

    sign_in(page, BOB_TOKEN)
    assert page.inner_text("#whoami") == "signed in as bob (human)"
    page.wait_for_selector("#jobs")
    up.set_tokens(bob=False)
    page.locator("#signin-view:not([hidden])").wait_for(timeout=90_000)
    assert "refused your token" in page.inner_text("#signin-error")
    assert "expired" in page.inner_text("#signin-error")
    assert page.evaluate("sessionStorage.getItem('dispatch.token')") is None


def test_the_page_routes_answer_as_the_api_does(up: WebUp) -> None:
    """Without a browser: the page's own routes need the token, refuse a bad job file naming
    what is wrong, and the page forbids the browser any other origin (its CSP)."""
    with urllib.request.urlopen(up.api + "/", timeout=30) as response:
        csp = response.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp
        assert "connect-src 'self'" in csp
        assert b"/ui/static/app.js" in response.read()
    code, answer = call(up.api, "wrong", "GET", "/ui/api/me")
    assert (code, answer["error"]["code"]) == (401, "unauthorized")
    code, answer = call(up.api, up.token, "GET", "/ui/static/secret.txt")
    assert code == 404
    code, answer = call(up.api, up.token, "GET", "/ui/api/jobs?needs=robot")
    assert (code, answer["error"]["field"]) == (400, "needs")

    def preview(text: str) -> tuple[int, Any]:
        request = urllib.request.Request(
            up.api + "/ui/api/preview",
            data=text.encode(),
            method="POST",
            headers={"Authorization": f"Bearer {up.token}", "Content-Type": "text/plain"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    code, answer = preview("[spec\n")
    assert code == 400
    assert "not valid TOML" in answer["error"]["message"]
    code, answer = preview('[spec]\ncluster = "mars"\ncommand = ["true"]\n')
    assert (code, answer["error"]["code"], answer["error"]["field"]) == (
        400,
        "unknown-cluster",
        "spec.cluster",
    )
    code, answer = preview(
        '[spec]\ncluster = "local"\ncommand = ["true"]\n\n'
        '[[policy.rules]]\non = ["preempted"]\naction = "resubmit"\nbudget = 1\n'
    )
    assert code == 200, answer
    assert "preempted" not in answer["plan"]["uncovered"]
    assert answer["body"]["spec"]["cluster"] == "local"
    code, _ = call(up.api, up.token, "GET", "/v1/jobs")  # nothing was submitted by it
    assert code == 200

    # The preview refuses what submit refuses, with submit's 400 and field (one check, the
    # operations layer's): here a field the spec doesn't have.
    code, answer = preview('[spec]\ncluster = "local"\ncommand = ["true"]\nbogus = 1\n')
    body = {"spec": {"cluster": "local", "command": ["true"], "bogus": 1}}
    submit_code, refused = call(up.api, up.token, "POST", "/v1/jobs", body)
    assert submit_code == 400, refused
    assert (code, answer["error"]["code"], answer["error"]["field"]) == (
        400,
        refused["error"]["code"],
        refused["error"]["field"],
    )
