from __future__ import annotations

from django.core.management.base import BaseCommand

from studio.services import create_plan


class Command(BaseCommand):
    help = "Create or update a plan."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--no-training", action="store_true", help="the plan does not include training")
        parser.add_argument("--max-concurrent-runs", type=int, default=2)
        parser.add_argument("--max-gpus", type=int, default=8)

    def handle(self, *args, **opts) -> None:
        plan = create_plan(opts["name"], includes_training=not opts["no_training"], max_concurrent_runs=opts["max_concurrent_runs"], max_gpus_per_run=opts["max_gpus"])
        self.stdout.write(f"plan {plan.name}: training={'yes' if plan.includes_training else 'no'}, {plan.max_concurrent_runs} concurrent run(s), {plan.max_gpus_per_run} GPU(s) per run")
