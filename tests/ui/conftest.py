"""UI fixtures: Debian's chromium driven by Playwright (sync API) against pytest-django's
live_server, a logged-in page, and a folder for screenshots (var/test-artifacts/ui/)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in this thread; Django's ORM refuses to run in one unless told.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def _own_celery_queue() -> None:
    """Other suites on this machine may share the Redis db; a worker of theirs on the default
    "studio" queue would take our dispatch tasks (and run them against its own database). Unless
    CELERY_QUEUE was chosen explicitly, the UI tests use a queue of their own; the Celery app reads
    its configuration lazily, so setting it before the first task is sent is enough."""
    if os.environ.get("CELERY_QUEUE"):
        return
    from django.conf import settings

    settings.CELERY_TASK_DEFAULT_QUEUE = f"studio-ui-{os.getpid()}"


_own_celery_queue()

CHROMIUM = os.environ.get("STUDIO_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts" / "ui"
PASSWORD = "pw"


@pytest.fixture(scope="session", autouse=True)
def _celery_queue_is_ours():
    from django.conf import settings

    from studio.celery import app

    assert app.conf.task_default_queue == settings.CELERY_TASK_DEFAULT_QUEUE, "the Celery app was configured before the UI tests chose their queue"


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def artifacts(request) -> Path:
    folder = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Shots:
    def __init__(self, page, folder: Path) -> None:
        self.page, self.folder, self.n = page, folder, 0

    def __call__(self, name: str) -> Path:
        self.n += 1
        path = self.folder / f"{self.n:02d}-{name}.png"
        # Chromium's full-page capture resizes the viewport for a moment and can restore a stale scroll
        # offset on the next input event (a click then lands elsewhere): capture at the top, then put it back.
        scroll = self.page.evaluate("() => window.scrollY")
        self.page.evaluate("() => window.scrollTo(0, 0)")
        self.page.screenshot(path=str(path), full_page=True)
        self.page.evaluate("(y) => new Promise(r => { window.scrollTo(0, y); requestAnimationFrame(() => requestAnimationFrame(r)); })", scroll)
        return path


@pytest.fixture
def page(browser, live_server, artifacts):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=live_server.url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors
    page.shot = Shots(page, artifacts)
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def login(page, username: str = "owner", password: str = PASSWORD) -> None:
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r".*/training/$"))


@pytest.fixture
def owner_page(transactional_db, project, page):
    """A browser logged in as the owner of project acme (team plan)."""
    login(page)
    return page
