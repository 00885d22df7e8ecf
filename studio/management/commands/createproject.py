from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from studio.errors import ApiError
from studio.models import Plan, Project
from studio.services import create_project, get_user


class Command(BaseCommand):
    help = "Create a project owned by an existing user."

    def add_arguments(self, parser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--owner", required=True)
        parser.add_argument("--plan")

    def handle(self, *args, **opts) -> None:
        if Project.objects.filter(slug=opts["slug"]).exists():
            raise CommandError(f"project {opts['slug']} already exists")
        try:
            owner = get_user(opts["owner"])
        except ApiError as exc:
            raise CommandError(exc.detail) from exc
        plan = None
        if opts["plan"]:
            plan = Plan.objects.filter(name=opts["plan"]).first()
            if plan is None:
                raise CommandError(f"no plan named {opts['plan']}: create it with `createplan {opts['plan']}`")
        try:
            project = create_project(opts["slug"], owner=owner, plan=plan)
        except ApiError as exc:
            raise CommandError("; ".join(f"{e.field}: {e.message}" for e in exc.errors) or exc.detail) from exc
        self.stdout.write(f"project {project.slug} (owner {owner.username}, plan {plan.name if plan else 'none'})")
