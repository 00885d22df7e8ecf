"""`manage.py hub_gc [--dry-run] [--grace-hours H]`: remove the Data Hub's unused blobs and stray
blob files (datahub.gc explains what is unused, the grace period and the locking). Run it from cron."""
from __future__ import annotations

import math
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from datahub import gc

MAX_HOURS = 24 * 365 * 100

class Command(BaseCommand):
    help = ("Remove Data Hub blobs that no commit and no unfinished upload uses, and files in the blob storage "
            "that no blob row names, once older than the grace period.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="list what would be removed, and remove nothing")
        parser.add_argument("--grace-hours", type=float, default=gc.DEFAULT_GRACE.total_seconds() / 3600,
                            help="keep whatever a writer used less than this many hours ago (default 24)")

    def handle(self, *args, **opts) -> None:
        hours = opts["grace_hours"]
        if not (math.isfinite(hours) and 0 <= hours <= MAX_HOURS):
            raise CommandError(f"--grace-hours: {hours:g} is not a grace period: give 0 to {MAX_HOURS} hours, e.g. --grace-hours 24")
        report = gc.collect(timedelta(hours=hours), dry_run=opts["dry_run"])
        verb = "would remove" if opts["dry_run"] else "removed"
        if opts["verbosity"] >= 2:
            for name, size in report.blobs + report.strays:
                self.stdout.write(f"{verb} {name} ({size} bytes)")
        self.stdout.write(
            f"hub_gc {verb} {len(report.blobs)} unused blob(s), {sum(s for _, s in report.blobs)} bytes, "
            f"and {len(report.strays)} stray file(s), {sum(s for _, s in report.strays)} bytes "
            f"(grace period {hours:g} h{', dry run: nothing was removed' if opts['dry_run'] else ''})"
        )
