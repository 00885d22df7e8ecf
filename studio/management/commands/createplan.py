from __future__ import annotations

import re
from argparse import ArgumentTypeError

from django.core.management.base import BaseCommand, CommandError

from studio.errors import counted
from studio.models import Plan
from studio.services import create_plan

PLAN_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}\Z")
LIMIT_MAX = 1_000_000  # far above any real plan, far below the column's 2**31 − 1


def count(raw: str) -> int:
    """A whole number from 0 to LIMIT_MAX; the database refuses the rest with a traceback."""
    try:
        value = int(raw)
    except ValueError as exc:
        raise ArgumentTypeError(f"{raw!r} is not a whole number") from exc
    if not 0 <= value <= LIMIT_MAX:
        raise ArgumentTypeError(f"must be from 0 to {LIMIT_MAX}, not {value}")
    return value


class Command(BaseCommand):
    help = ("Create a plan, or update one: an option left out keeps the plan's value "
            "(a new plan: training included, 2 concurrent runs, 8 GPUs per run).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="lower-case letters, digits, - and _ (at most 64), e.g. team")
        training = parser.add_mutually_exclusive_group()
        training.add_argument("--no-training", dest="training", action="store_false", default=None, help="the plan does not include training")
        training.add_argument("--training", dest="training", action="store_true", help="the plan includes training")
        parser.add_argument("--max-concurrent-runs", type=count)
        parser.add_argument("--max-gpus", type=count)

    def handle(self, *args, **opts) -> None:
        name = opts["name"]
        if not PLAN_NAME.match(name):
            raise CommandError(f"{name!r} is not a plan name: use lower-case letters, digits, '-' and '_' (at most 64), e.g. team")
        given = {"includes_training": opts["training"], "max_concurrent_runs": opts["max_concurrent_runs"], "max_gpus_per_run": opts["max_gpus"]}
        current = Plan.objects.filter(name=name).first()
        values = {key: value if value is not None else (getattr(current, key) if current else None) for key, value in given.items()}
        plan = create_plan(name, **{key: value for key, value in values.items() if value is not None})
        verb = "updated" if current else "created"
        self.stdout.write(f"plan {plan.name} {verb}: training={'yes' if plan.includes_training else 'no'}, "
                          f"{counted(plan.max_concurrent_runs, 'concurrent run')}, {counted(plan.max_gpus_per_run, 'GPU')} per run")
