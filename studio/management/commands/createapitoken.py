from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from studio.errors import ApiError
from studio.models import Project
from studio.services import create_api_token, get_user


class Command(BaseCommand):
    help = "Create an API token for a user in a project; prints the token (shown once) on the last line."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--project", required=True)
        parser.add_argument("--name", default="")

    def handle(self, *args, **opts) -> None:
        project = Project.objects.filter(slug=opts["project"]).first()
        if project is None:
            raise CommandError(f"no project {opts['project']}")
        try:
            token, plaintext = create_api_token(get_user(opts["username"]), project, name=opts["name"])
        except ApiError as exc:
            raise CommandError("; ".join(e.message for e in exc.errors) or exc.detail) from exc
        self.stdout.write(f"token {token.prefix}… for {opts['username']} in {project.slug} (store it now: it is not shown again)")
        self.stdout.write(plaintext)
