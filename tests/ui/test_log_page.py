"""The run's log page on a long log: it opens on the newest lines, loads earlier ones a page at a time
by the API's cursor (line ids), and follows a run that can still report. It showed up to 20,000 lines
in one page (2-3 MB for a long run's log, more with long lines) and never followed. Django's test
client for the answers; one browser test for the clicks, the scroll place and the follow."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from training import services
from training import status as status_service
from training.models import LogLine, Status, TrainingRun

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def page_size() -> tuple[int, int]:
    """(lines, characters) of a page of the log page. Imported through the URLconf, in the order a
    request loads them: training.views on its own starts a circular import of the API's routers."""
    import studio.urls  # noqa: F401
    from training.views import LOG_PAGE_CHARS, LOG_PAGE_LINES

    return LOG_PAGE_LINES, LOG_PAGE_CHARS


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def run_with_log(project, user, lines: list[str], status: str = Status.COMPLETED, attempt: int = 1) -> TrainingRun:
    run = services.create_run(project, user, name="long log", method="sft", base_model="org/base", dataset="org/data")
    LogLine.objects.bulk_create([LogLine(run=run, attempt=attempt, line=line) for line in lines], batch_size=5000)
    finished = timezone.now() - timedelta(hours=1) if status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED) else None
    TrainingRun.objects.filter(pk=run.pk).update(status=status, attempt=attempt, finished_at=finished)
    return TrainingRun.objects.get(pk=run.pk)


def shown(html: str) -> list[str]:
    """The lines in the page's log box."""
    box = html.split('id="full-log"')[1].split(">", 1)[1].split("</pre>")[0]
    return [line for line in re.sub(r"<span[^>]*>.*?</span>", "", box).split("\n") if line]


def earlier_link(html: str) -> str | None:
    found = re.search(r'id="log-earlier-link" href="([^"]+)"', html)
    return found.group(1).replace("&amp;", "&") if found else None


def follower(html: str) -> tuple[str, str] | None:
    """(url, trigger) of the page's poll for new lines, or None when it does not follow."""
    found = re.search(r'<p class="muted log-follow" id="log-follow"[^>]*?hx-get="([^"]+)" hx-trigger="([^"]+)"', html)
    assert 'id="log-follow"' in html
    return (found.group(1).replace("&amp;", "&"), found.group(2)) if found else None


def test_a_20000_line_log_opens_on_its_newest_page_and_loads_every_earlier_line_once(project, users):
    LOG_PAGE_LINES, LOG_PAGE_CHARS = page_size()
    lines = [f"line {i:05d} loss=0.{i:05d}" for i in range(20_000)]
    run = run_with_log(project, users["owner"], lines)
    client = client_for(users["viewer"])
    response = client.get(f"/training/runs/{run.pk}/log")
    html = response.content.decode()
    assert response.status_code == 200 and "20000 lines" in html
    assert shown(html) == lines[-LOG_PAGE_LINES:]  # it was all 20,000
    assert len(response.content) < 100_000, len(response.content)
    assert follower(html) is None  # a completed run adds no lines

    # "Load earlier lines": each answer is the page before, then the link to the page before that.
    got, link, pages = shown(html), earlier_link(html), 0
    while link:
        part = client.get(link, **HTMX)
        body = part.content.decode()
        assert part.status_code == 200 and "<html" not in body
        text, oob = body.split('<p class="log-pages" id="log-earlier"', 1)
        got = [line for line in text.split("\n") if line] + got
        assert 'hx-swap-oob="true"' in oob.split(">")[0]
        link, pages = earlier_link(body), pages + 1
    assert got == lines and pages == 20_000 // LOG_PAGE_LINES - 1
    assert "The log below starts at its first line." in body


def test_the_overview_log_box_keeps_the_newest_long_lines_within_its_character_budget(project, users):
    import studio.urls  # noqa: F401 - training.views through the URLconf, as page_size() says
    from training.views import LOG_TAIL_CHARS

    run = run_with_log(project, users["owner"], [f"{i:03d} " + "x" * 9_996 for i in range(200)], status=Status.RUNNING)
    client = client_for(users["owner"])
    for url in (f"/training/runs/{run.pk}/", f"/training/runs/{run.pk}/live"):  # the page, and the box's 5 s poll
        response = client.get(url, HTTP_HX_REQUEST="true")
        html = response.content.decode()
        box = html.split('id="training-log"')[1].split(">", 1)[1].split("</pre>")[0]
        lines = [line for line in re.sub(r"<span[^>]*>.*?</span>", "", box).split("\n") if line]
        assert lines[-1].startswith("199 ") and len(lines) == LOG_TAIL_CHARS // 10_000
        assert "earlier lines are on the full log page" in box
        assert f"last {len(lines)} lines)" in html
        assert len(response.content) < LOG_TAIL_CHARS + 100_000, len(response.content)  # it was 2 MB


def test_a_page_of_long_lines_stops_near_the_character_budget(project, users):
    LOG_PAGE_LINES, LOG_PAGE_CHARS = page_size()
    run = run_with_log(project, users["owner"], [f"{i:03d} " + "x" * 9_996 for i in range(200)])
    response = client_for(users["owner"]).get(f"/training/runs/{run.pk}/log")
    lines = shown(response.content.decode())
    assert lines[-1].startswith("199 ") and len(lines) == LOG_PAGE_CHARS // 10_000
    assert len(response.content) < LOG_PAGE_CHARS + 20_000  # it was 2 MB
    assert earlier_link(response.content.decode())


def test_the_log_page_of_a_running_run_follows_it_until_it_ends(project, users):
    run = run_with_log(project, users["owner"], ["step 1", "step 2", "step 3"], status=Status.RUNNING)
    client = client_for(users["viewer"])
    html = client.get(f"/training/runs/{run.pk}/log").content.decode()
    last = LogLine.objects.filter(run=run).order_by("-id").first().pk
    assert follower(html) == (f"/training/runs/{run.pk}/log?after={last}", "every 5s")
    assert "Following the run" in html

    # Nothing new: the same answer each time (studio.js leaves the page alone), and no count query.
    quiet = client.get(f"/training/runs/{run.pk}/log", {"after": last}, **HTMX).content.decode()
    assert quiet == client.get(f"/training/runs/{run.pk}/log", {"after": last}, **HTMX).content.decode()
    assert "step" not in quiet.split("<p")[0] and 'id="log-scope"' not in quiet and follower(quiet)[0].endswith(f"after={last}")

    LogLine.objects.bulk_create([LogLine(run=run, attempt=1, line=f"step {i}") for i in (4, 5)])
    new = client.get(f"/training/runs/{run.pk}/log", {"after": last}, **HTMX).content.decode()
    assert new.split("<")[0] == "step 4\nstep 5\n"  # appended at the end of the box, oldest first
    assert re.search(r'id="log-scope" data-testid="log-scope" hx-swap-oob="true">Since the run was last started \(attempt 1\): 5 lines', new)
    newest = LogLine.objects.filter(run=run).order_by("-id").first().pk
    assert follower(new) == (f"/training/runs/{run.pk}/log?after={newest}", "every 5s")

    status_service.transition(run.pk, Status.COMPLETED)
    TrainingRun.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(minutes=5))  # past its late reports
    ended = client.get(f"/training/runs/{run.pk}/log", {"after": newest}, **HTMX).content.decode()
    assert follower(ended) is None and "Following the run" not in ended


def test_a_follow_that_is_a_page_behind_asks_again_at_once(project, users):
    LOG_PAGE_LINES, LOG_PAGE_CHARS = page_size()
    run = run_with_log(project, users["owner"], [], status=Status.RUNNING)
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/log").content.decode()
    assert 'id="log-empty">No log lines yet.</span>' in html and follower(html)[0].endswith("after=0")
    LogLine.objects.bulk_create([LogLine(run=run, attempt=1, line=f"burst {i}") for i in range(LOG_PAGE_LINES + 5)])
    first = client.get(f"/training/runs/{run.pk}/log", {"after": 0}, **HTMX).content.decode()
    assert first.count("burst ") == LOG_PAGE_LINES and '<span id="log-empty" hx-swap-oob="delete">' in first
    url, trigger = follower(first)
    assert trigger == "load delay:200ms"
    rest = client.get(url, **HTMX).content.decode()
    assert rest.split("<")[0].split("\n")[:-1] == [f"burst {i}" for i in range(LOG_PAGE_LINES, LOG_PAGE_LINES + 5)]
    assert follower(rest)[1] == "every 5s" and "log-empty" not in rest


def test_an_earlier_attempts_page_pages_within_it_and_does_not_follow(project, users):
    LOG_PAGE_LINES, LOG_PAGE_CHARS = page_size()
    run = run_with_log(project, users["owner"], [f"a1 {i}" for i in range(LOG_PAGE_LINES + 1)], status=Status.RUNNING)
    LogLine.objects.bulk_create([LogLine(run=run, attempt=2, line="a2 0")])
    TrainingRun.objects.filter(pk=run.pk).update(attempt=2)
    client = client_for(users["owner"])
    html = client.get(f"/training/runs/{run.pk}/log", {"attempt": "1"}).content.decode()
    assert shown(html)[-1] == f"a1 {LOG_PAGE_LINES}" and follower(html) is None
    link = earlier_link(html)
    assert link.startswith(f"/training/runs/{run.pk}/log?attempt=1&before=")
    assert client.get(link, **HTMX).content.decode().split("<")[0] == "a1 0\n"
    current = client.get(f"/training/runs/{run.pk}/log", {"attempt": "2"}).content.decode()
    assert shown(current) == ["a2 0"] and follower(current)[0] == f"/training/runs/{run.pk}/log?attempt=2&after={LogLine.objects.get(line='a2 0').pk}"


def test_an_earlier_page_without_htmx_is_a_whole_page_with_a_way_back_to_the_newest(project, users):
    LOG_PAGE_LINES, LOG_PAGE_CHARS = page_size()
    run = run_with_log(project, users["owner"], [f"line {i}" for i in range(LOG_PAGE_LINES + 10)], status=Status.RUNNING)
    client = client_for(users["owner"])
    html = client.get(earlier_link(client.get(f"/training/runs/{run.pk}/log").content.decode())).content.decode()
    assert shown(html) == [f"line {i}" for i in range(10)]
    assert f'<a href="/training/runs/{run.pk}/log">Newest lines</a>' in html and follower(html) is None and not earlier_link(html)


@pytest.mark.parametrize("query", [{"before": "x"}, {"after": "-1"}, {"after": "٣"}, {"before": "1", "after": "2"}, {"after": str(2**63)}])
def test_a_cursor_that_is_not_a_line_id_is_a_400_that_says_so(project, users, query):
    run = run_with_log(project, users["owner"], ["one"])
    response = client_for(users["owner"]).get(f"/training/runs/{run.pk}/log", query)
    assert response.status_code == 400
    assert "is not a line id" in response.content.decode() or "give one of them" in response.content.decode()


def test_an_outsider_gets_404_for_a_page_of_a_runs_log(project, users):
    run = run_with_log(project, users["owner"], ["a line only the team may read"], status=Status.RUNNING)
    for query in ({"before": "999999"}, {"after": "0"}):
        response = client_for(users["outsider"]).get(f"/training/runs/{run.pk}/log", query, **HTMX)
        assert response.status_code == 404 and b"a line only the team may read" not in response.content


@pytest.mark.django_db(transaction=True)
def test_load_earlier_keeps_the_readers_place_and_the_page_follows_new_lines(owner_page, project, users):
    LOG_PAGE_LINES, LOG_PAGE_CHARS = page_size()
    page = owner_page
    run = run_with_log(project, users["owner"], [f"line {i:04d}" for i in range(LOG_PAGE_LINES + 500)], status=Status.RUNNING)
    page.goto(f"/training/runs/{run.pk}/log")
    log = page.locator("#full-log")
    expect(log).to_contain_text(f"line {LOG_PAGE_LINES + 499:04d}")
    expect(log).not_to_contain_text("line 0499\n")
    at_end = "el => el.scrollHeight - el.scrollTop - el.clientHeight < 24"
    assert log.evaluate(at_end)

    # The reader has scrolled up a little to read: the earlier lines go above without moving what they read.
    below = log.evaluate("el => { el.scrollTop = el.scrollHeight - el.clientHeight - 300; return el.scrollHeight - el.scrollTop; }")
    page.get_by_role("link", name="Load earlier lines").click()
    expect(log).to_contain_text("line 0499\n")
    assert log.evaluate("el => el.textContent.startsWith('line 0000\\n')")
    assert abs(log.evaluate("el => el.scrollHeight - el.scrollTop") - below) <= 2, "the lines put before moved the reader off the line they were at"
    expect(page.get_by_test_id("log-earlier")).to_have_text("The log below starts at its first line.")
    expect(page.get_by_role("link", name="Load earlier lines")).to_have_count(0)

    log.evaluate("el => { el.scrollTop = el.scrollHeight; }")  # back at the end, which follows the new lines
    LogLine.objects.create(run=run, attempt=1, line="a line written while the page was open")
    expect(log).to_contain_text("a line written while the page was open", timeout=12_000)  # the poll is every 5 s
    assert log.evaluate("el => el.textContent.endsWith('line 1499\\na line written while the page was open\\n')")
    assert log.evaluate(at_end)
    expect(page.get_by_test_id("log-scope")).to_contain_text(f"{LOG_PAGE_LINES + 501} lines")
    page.shot("log-page-followed")
