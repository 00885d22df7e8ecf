from __future__ import annotations

from argparse import ArgumentTypeError

from django.core.management.base import BaseCommand

from studio.services import create_plan


def count(raw: str) -> int:
    """A non-negative integer; the database refuses negatives with an IntegrityError traceback."""
    try:
        value = int(raw)
    except ValueError as exc:
        raise ArgumentTypeError(f"{raw!r} is not a whole number") from exc
    if value < 0:
        raise ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


class Command(BaseCommand):
    help = "Create or update a plan."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--no-training", action="store_true", help="the plan does not include training")
        parser.add_argument("--max-concurrent-runs", type=count, default=2)
        parser.add_argument("--max-gpus", type=count, default=8)

    def handle(self, *args, **opts) -> None:
        plan = create_plan(opts["name"], includes_training=not opts["no_training"], max_concurrent_runs=opts["max_concurrent_runs"], max_gpus_per_run=opts["max_gpus"])
        self.stdout.write(f"plan {plan.name}: training={'yes' if plan.includes_training else 'no'}, {plan.max_concurrent_runs} concurrent run(s), {plan.max_gpus_per_run} GPU(s) per run")
