"""`manage.py hub_gc [--dry-run] [--grace-hours H] [--upload-days D]`: abort upload sessions idle for
D days, then remove staging leftovers, the Data Hub's unused blobs and stray blob files (datahub.gc
explains what is idle and unused, the grace period and the locking). Run it from cron."""
from __future__ import annotations

import math
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from datahub import gc

MAX_HOURS = 24 * 365 * 100
MAX_DAYS = 365 * 100


class Command(BaseCommand):
    help = ("Abort upload sessions with no activity for --upload-days; then, once older than the grace period, remove "
            "leftovers in the staging dir, Data Hub blobs that no commit and no unfinished upload uses, and files in "
            "the blob storage that no blob row names.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="list what would be aborted or removed, and change nothing")
        parser.add_argument("--grace-hours", type=float, default=gc.DEFAULT_GRACE.total_seconds() / 3600,
                            help="keep whatever a writer used less than this many hours ago (default 24)")
        parser.add_argument("--upload-days", type=float, default=gc.DEFAULT_UPLOAD_IDLE.days,
                            help="abort an open or committing upload session with no activity for this many days (default 7)")

    def handle(self, *args, **opts) -> None:
        hours, days = opts["grace_hours"], opts["upload_days"]
        if not (math.isfinite(hours) and 0 <= hours <= MAX_HOURS):
            raise CommandError(f"--grace-hours: {hours:g} is not a grace period: give 0 to {MAX_HOURS} hours, e.g. --grace-hours 24")
        if not (math.isfinite(days) and 0 < days <= MAX_DAYS):
            raise CommandError(f"--upload-days: {days:g} is not an idle period: give more than 0 and at most {MAX_DAYS} days, e.g. --upload-days 7")
        dry = opts["dry_run"]
        report = gc.collect(timedelta(hours=hours), dry_run=dry, upload_idle=timedelta(days=days))
        expired, verb = ("would abort", "would remove") if dry else ("aborted", "removed")
        if opts["verbosity"] >= 2:
            for name, size in report.sessions:
                self.stdout.write(f"{expired} {name} ({size} bytes staged)")
            for name, size in report.staging + report.blobs + report.strays:
                self.stdout.write(f"{verb} {name} ({size} bytes)")

        def count(rows: list[tuple[str, int]], what: str) -> str:
            return f"{len(rows)} {what}, {sum(s for _, s in rows)} bytes"

        self.stdout.write(
            f"hub_gc {expired} {count(report.sessions, 'idle upload session(s)')} staged; "
            f"{verb} {count(report.staging, 'staging leftover(s)')}; "
            f"{verb} {count(report.blobs, 'unused blob(s)')}, and {count(report.strays, 'stray file(s)')} "
            f"(grace period {gc.spell(timedelta(hours=hours))}, uploads idle {gc.spell(timedelta(days=days))}"
            f"{', dry run: nothing was removed or aborted' if dry else ''})"
        )
