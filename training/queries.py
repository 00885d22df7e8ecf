"""Permission-scoped run lookups, the run list's search, and the reads of a run's rows."""
from __future__ import annotations

import unicodedata
from datetime import datetime

from django.db.models import Q, QuerySet
from django.http import StreamingHttpResponse

from studio.auth import Actor
from studio.errors import BadRequest, Finding, NotFound
from training.models import Generation, LogLine, TrainingRun


def runs_for(actor: Actor) -> QuerySet[TrainingRun]:
    return TrainingRun.objects.filter(project_id__in=actor.scoped_project_ids())


def get_run_for(actor: Actor, run_id: int, *, write: bool = False) -> TrainingRun:
    """The run, or 404 for anyone outside its project; with write, 403 for a viewer."""
    run = runs_for(actor).select_related("project", "project__plan", "experiment", "resume_checkpoint").filter(pk=run_id).first()
    if run is None:
        raise NotFound(f"No training run {run_id} in your projects.")
    if write:
        actor.require_write(run.project)
    return run


def get_generation_for(actor: Actor, generation_id: int) -> Generation:
    """A Try it answer of a run in the caller's projects, or 404."""
    generation = Generation.objects.select_related("checkpoint").filter(pk=generation_id, run__project_id__in=actor.scoped_project_ids()).first()
    if generation is None:
        raise NotFound(f"No generation {generation_id} in your projects.")
    return generation


def search_runs(rows: QuerySet[TrainingRun], text: str | None) -> QuerySet[TrainingRun]:
    """Runs whose name or base model contains `text` (any case): the run list's search, UI and API.
    An accent may be stored as one character (é, as typed) or as a letter and a combining mark (e +
    U+0301, as macOS writes names): `text` is looked for in both forms (NFC and NFD), in the database."""
    text = (text or "").strip()
    match = Q()
    for form in {unicodedata.normalize("NFC", text), unicodedata.normalize("NFD", text)} if text else ():
        match |= Q(name__icontains=form) | Q(base_model__icontains=form)
    return rows.filter(match) if text else rows


def run_list_place(actor: Actor, run_id: int) -> tuple[datetime, int]:
    """Where run `run_id` stands in the run list of the actor's project: its (created_at, id), the
    list's order, whatever filters it is read with (a run that left a status filter since still marks
    a place). A 400 naming `after` for a run that is not in that project: deleted since, or never in
    it (which of the two is not said, so another project's run ids are not confirmed)."""
    place = runs_for(actor).filter(project=actor.require_project(), pk=run_id).values_list("created_at", "id").first()
    if place is None:
        raise BadRequest(f"No run {run_id} in this project's runs to page after.", [Finding(
            "after", f"run {run_id} is not in this project's runs (deleted since your last page, or never one of them): give the id of the "
                     "run before it on that page (the runs after it are the same ones), or leave after out to start again from the newest")])
    return place


def runs_after(rows: QuerySet[TrainingRun], place: tuple[datetime, int]) -> QuerySet[TrainingRun]:
    """The rows that come after `place` (a run's created_at and id) in the run list's order, newest
    first (-created_at, -id): a keyset, so runs created or deleted meanwhile shift no later page."""
    created_at, run_id = place
    return rows.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=run_id))


def filter_rollouts(rows: QuerySet, step: int | None = None, min_reward: float | None = None, max_reward: float | None = None) -> QuerySet:
    """The Rollouts tab's filters and GET /rollouts' query: one step, a reward range."""
    if step is not None:
        rows = rows.filter(step=step)
    if min_reward is not None:
        rows = rows.filter(reward__gte=min_reward)
    if max_reward is not None:
        rows = rows.filter(reward__lte=max_reward)
    return rows


def log_lines(run: TrainingRun, attempt: int | None = None) -> QuerySet[LogLine]:
    """The log of attempt `attempt` of `run` (GET .../logs?attempt=, the run page's log links), or
    without it the run's current log: the lines since its last START, i.e. its current attempt and
    those a spot interruption retried from. Lines written before the first START (a START withdrawn
    before a worker claimed it) read with attempt 1. Unordered."""
    low, high = (run.start_attempt, run.attempt) if attempt is None else (attempt, attempt)
    return LogLine.objects.filter(run=run, attempt__gte=0 if low <= 1 else low, attempt__lte=high)


# One GET .../logs answer: at most LOGS_MAX_LINES lines (the tail, or a page after a cursor), and a
# page of long lines ends early at about LOGS_MAX_CHARS characters: a 128k-line log was one 16.6 MB answer.
LOGS_MAX_LINES = 5000
LOGS_MAX_CHARS = 2_000_000


def within_budget(rows: list[tuple], chars: int = LOGS_MAX_CHARS) -> list[tuple]:
    """The leading (id, line, ...) rows whose lines fit in `chars` characters; always the first, so a page is never empty."""
    size = 0
    for i, row in enumerate(rows):
        size += len(row[1])
        if i and size > chars:
            return rows[:i]
    return rows


# What GET .../logs answers of a line: its text and when the Studio stored it.
TIMED = ("id", "line", "created_at")


def log_page(lines: QuerySet[LogLine], after: int, limit: int) -> tuple[list[tuple[int, str, datetime]], int | None]:
    """Up to `limit` (id, line, stored at) rows after line id `after`, oldest first, and the cursor for the next page
    (the id of this page's last line), None when this page reaches the end of the log as it is now."""
    page, more = log_rows_after(lines, after, limit, columns=TIMED)
    return page, (page[-1][0] if more else None)


def log_rows_after(lines: QuerySet[LogLine], after: int, limit: int, chars: int = LOGS_MAX_CHARS, columns: tuple[str, ...] = ("id", "line")) -> tuple[list, bool]:
    """Up to `limit` (id, line) rows (or `columns`) after line id `after`, oldest first, and whether later lines remain."""
    rows = list(lines.filter(id__gt=after).order_by("id").values_list(*columns)[: limit + 1])
    page = within_budget(rows[:limit], chars)
    return page, len(page) < len(rows)


def log_rows_before(lines: QuerySet[LogLine], before: int | None, limit: int, chars: int = LOGS_MAX_CHARS, columns: tuple[str, ...] = ("id", "line")) -> tuple[list, bool]:
    """Up to `limit` (id, line) rows (or `columns`) before line id `before` (the last ones without it), oldest first,
    fewer when they run past `chars` characters; and whether earlier lines remain."""
    if before is not None:
        lines = lines.filter(id__lt=before)
    rows = list(lines.order_by("-id").values_list(*columns)[: limit + 1])
    page = within_budget(rows[:limit], chars)
    return page[::-1], len(page) < len(rows)


def log_tail(lines: QuerySet[LogLine], tail: int) -> list[tuple[int, str, datetime]]:
    """The last `tail` (id, line, stored at) rows, oldest first (fewer when they run past LOGS_MAX_CHARS)."""
    return log_rows_before(lines, None, tail, columns=TIMED)[0]


def log_text(run: TrainingRun, attempt: int | None) -> StreamingHttpResponse:
    """The log as plain text, every line, streamed (a log can be long): the run page's log.txt and
    GET /api/training-runs/{id}/log.txt."""
    lines = log_lines(run, attempt).order_by("id").values_list("line", flat=True)
    response = StreamingHttpResponse((line + "\n" for line in lines.iterator(chunk_size=2000)), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'inline; filename="run-{run.pk}-{f"attempt-{attempt}" if attempt else "log"}.txt"'
    return response
