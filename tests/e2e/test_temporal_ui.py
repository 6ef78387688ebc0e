"""The Temporal UI of the embedded stack, as a person sees it, in headless Chromium (Debian's
`chromium`, driven by Playwright; no browser is downloaded)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import psutil
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright
from temporalio.client import Client

from tests.e2e.conftest import DevStack, procbus

pytestmark = pytest.mark.spark  # a load on the stack's worker

# Flags for a closed network: no background connections, no first-run pages, no updates.
CHROMIUM_FLAGS = [
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
UI_TIMEOUT_MS = 60_000  # 30 s ran out while the suite's Spark jobs held the 2 cores
# A page loaded while the stack's Spark job takes the host's cores.
SLOW_PAGE_MS = 90_000
UI_ERROR_RELOADS = 3
# For `expect` too (its own default is 5 s): on 2 busy cores a page can take longer to fill.
expect.set_options(timeout=UI_TIMEOUT_MS)


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, (
        "Chromium is missing; the Temporal UI test drives it headless. `make test` installs it "
        "when run as root; otherwise: sudo apt-get install -y chromium"
    )
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    flags = CHROMIUM_FLAGS + (["--no-sandbox"] if os.geteuid() == 0 else [])
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_path(), args=flags)
        yield launched
        launched.close()


@contextlib.contextmanager
def spark_held(stack: DevStack) -> Iterator[None]:
    """The stack's Spark JVM stopped (SIGSTOP) meanwhile, so its running job stays running."""
    assert stack.process is not None
    jvms = [
        child
        for child in psutil.Process(stack.process.pid).children(recursive=True)
        if child.name() == "java"
    ]
    assert jvms, "the stack's worker has no Spark JVM"
    for jvm in jvms:
        jvm.suspend()
    try:
        yield
    finally:
        for jvm in jvms:
            jvm.resume()


def open_page(page: Page, url: str, shows: Locator, timeout: float = UI_TIMEOUT_MS) -> None:
    """Load a page of the UI until it `shows` what it should. The UI's error page (its server
    failed a request to Temporal: seen once on a host the suite kept busy) is loaded again, a
    few times at most, as a person would click its "Try a refresh"."""
    error = page.get_by_text("Uh oh. There's an error.")
    for _ in range(UI_ERROR_RELOADS):
        page.goto(url, timeout=timeout)
        expect(shows.or_(error).first).to_be_visible(timeout=timeout)
        if not error.is_visible():
            return
        page.wait_for_timeout(2_000)
    raise AssertionError(f"the UI showed its error page {UI_ERROR_RELOADS} times for {url}")


async def wait_for_spark_heartbeat(stack: DevStack, workflow_id: str) -> None:
    """Until the procedure's pending Spark job has heartbeated its task counts while running."""
    client = await Client.connect(str(stack.stack()["temporal_address"]))
    handle = client.get_workflow_handle(workflow_id)
    details: list[object] = []  # the last seen, for the failure's message
    try:
        async with asyncio.timeout(90):
            while True:
                description = await handle.describe()
                for pending in description.raw_description.pending_activities:
                    details = [json.loads(p.data) for p in pending.heartbeat_details.payloads]
                    if any(
                        isinstance(d, dict) and d.get("phase") == "running" and "tasks_total" in d
                        for d in details
                    ):
                        return
                await asyncio.sleep(0.3)
    except TimeoutError:
        raise AssertionError(f"no running Spark job heartbeated in 90 s: {details}") from None


def ok(stack: DevStack, *args: str) -> str:
    result = procbus(stack.env, *args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


@pytest.mark.timeout(600)  # 140 s when the suite shares 2 cores, and longer waits for pages
def test_the_ui_shows_procedures_their_steps_and_the_schedules(
    dev_stack: DevStack, browser: Browser
) -> None:
    dev_stack.start()
    ok(dev_stack, "namespace", "create", "sales", "--wait")
    created = ok(dev_stack, "table", "create", "sales.orders", "--schema", "id:bigint", "--wait")
    table_id = created.split()[0]
    refused = procbus(dev_stack.env, "namespace", "create", "sales", "--wait")  # exists
    refused_id = refused.stdout.split()[0]
    ui = str(dev_stack.stack()["ui_url"])
    page: Page = browser.new_page(viewport={"width": 1600, "height": 1200})
    page.set_default_timeout(UI_TIMEOUT_MS)

    # The workflows page lists the procedures, not a flood of sweeps.
    open_page(page, f"{ui}/namespaces/default/workflows", page.get_by_text(table_id))
    rows = page.locator("tr", has_text="CreateTable")
    expect(page.get_by_text(table_id).first).to_be_visible()
    expect(page.get_by_text(refused_id).first).to_be_visible()
    assert rows.count() >= 1
    assert page.locator("tr", has_text="OutboxSweep").count() <= 1  # hourly at most

    # A query on ProcedureState finds each procedure by its state.
    query = quote('ProcedureState = "ROLLED_BACK"')
    open_page(
        page, f"{ui}/namespaces/default/workflows?query={query}", page.get_by_text(refused_id)
    )
    expect(page.get_by_text(refused_id).first).to_be_visible()
    expect(page.get_by_text(table_id)).to_have_count(0)

    # A procedure's page: the summary of each step, and the current details line.
    open_page(
        page,
        f"{ui}/namespaces/default/workflows/{table_id}",
        page.get_by_text("add sales.orders to the catalog"),
    )
    expect(page.get_by_text("add sales.orders to the catalog").first).to_be_visible()
    expect(page.get_by_text("record TableCreated for delivery").first).to_be_visible()
    # refresh_cache is a broadcast: one send per worker, named for the worker it went to.
    expect(page.get_by_text(re.compile(r"apply put_descriptor on \S+")).first).to_be_visible()
    page.get_by_text("User Metadata").click()
    # Summary and current details are markdown, each rendered in its own frame.
    summary, details = page.frame_locator("iframe").first, page.frame_locator("iframe").last
    expect(summary.get_by_text("CreateTable sales.orders")).to_be_visible()
    expect(details.get_by_text("SUCCEEDED")).to_be_visible()
    expect(details.get_by_text("5 steps done")).to_be_visible()
    expect(
        details.get_by_text(re.compile(r"refresh_cache on the workers: \S+ applied"))
    ).to_be_visible()

    # A running Spark job: its pending activity shows the progress it heartbeats.
    ok(dev_stack, "table", "create", "sales.events", "--schema", "id:bigint,note:string", "--wait")
    source = dev_stack.state_dir / "warehouse" / "incoming" / "events.csv"  # a load root
    with source.open("w") as out:
        out.write("id,note\n")
        out.writelines(f"{n},event number {n}\n" for n in range(3_000_000))
    load_id = ok(dev_stack, "table", "load", "sales.events", "--from", str(source)).strip()
    # Asked of Temporal first, which is where the UI reads it: reloading the page until then
    # cost Chromium more CPU than the rest of the test. Then the page must show it.
    with ThreadPoolExecutor(1) as thread:  # Playwright's sync API holds this thread's loop
        thread.submit(asyncio.run, wait_for_spark_heartbeat(dev_stack, load_id)).result()
    # The job is held where it is while the page is read: on a quiet host it ends within
    # seconds, before the UI has shown it. The worker goes on heartbeating its last progress.
    with spark_held(dev_stack):
        # The tab's link, followed as a page load: a click before the page's script has taken
        # over its links is a whole page load too, and on a busy host Playwright's wait for it
        # after the click ran out (30 s) while the page was still loading.
        tab = page.get_by_role("tab", name="Pending Activities")
        open_page(page, f"{ui}/namespaces/default/workflows/{load_id}", tab)
        open_page(
            page,
            f"{ui}{tab.get_attribute('href')}",
            page.get_by_text("run_load_job"),
            timeout=SLOW_PAGE_MS,
        )
        # Read as the page's text: the UI highlights JSON in pieces, so one element never holds
        # a whole "key": value pair.
        body = page.locator("body")
        expect(body).to_contain_text(re.compile(r'"phase":\s*"running"'), timeout=SLOW_PAGE_MS)
        expect(body).to_contain_text("tasks_total")
        shown = page.inner_text("body")
    assert "run_load_job" in shown
    # Seen running: rolled back rather than waited for (the job would run on for 30 s).
    ok(dev_stack, "proc", "abort", load_id)
    waited = procbus(dev_stack.env, "proc", "wait", load_id, "--timeout", "180")
    assert waited.returncode == 1 and "ROLLED_BACK" in waited.stdout, waited

    # The Schedules page lists procbus's sweep, hourly, and a compaction schedule.
    ok(
        dev_stack,
        "schedule",
        "create",
        "events-compact",
        "--procedure",
        "compact",
        "--table",
        "sales.events",
        "--every",
        "6h",
    )
    open_page(page, f"{ui}/namespaces/default/schedules", page.get_by_text("procbus-outbox-sweep"))
    expect(page.get_by_text("procbus-outbox-sweep").first).to_be_visible()
    expect(page.get_by_text("Every 1 hour").first).to_be_visible()
    expect(page.get_by_text("events-compact").first).to_be_visible()
    expect(page.get_by_text(re.compile(r"Every 6 hour")).first).to_be_visible()
    page.close()
