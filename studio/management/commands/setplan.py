from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from studio.models import Plan, Project
from studio.services import set_plan


class Command(BaseCommand):
    help = "Put a project on a plan."

    def add_arguments(self, parser) -> None:
        parser.add_argument("slug")
        parser.add_argument("plan")

    def handle(self, *args, **opts) -> None:
        project = Project.objects.filter(slug=opts["slug"]).first()
        if project is None:
            raise CommandError(f"no project {opts['slug']}")
        plan = Plan.objects.filter(name=opts["plan"]).first()
        if plan is None:
            raise CommandError(f"no plan named {opts['plan']}")
        set_plan(project, plan)
        self.stdout.write(f"project {project.slug} is on plan {plan.name}")
