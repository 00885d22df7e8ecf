"""Set up the embedded demo: an admin user, plans, a project, a token, and (when the engine is
present) a tiny student/teacher model pair and demo datasets built offline, also committed to the
demo project's Data Hub. Safe to run again."""
from __future__ import annotations

import json
import os
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.management.base import BaseCommand, CommandError, CommandParser

from datahub.commits import commit_files
from datahub.models import Repo, RepoType
from datahub.repos import create_repo
from studio.models import Plan, Project
from studio.services import create_api_token, create_plan, create_project
from training.suggestions import demo_built, demo_elsewhere, demo_marker, demo_recorded, demo_repo_name

PRODUCTION_FLAG = "--i-know-this-is-production"
# The demo's plans, made only where missing: an operator's createplan settings are theirs to keep.
DEMO_PLANS: dict[str, dict[str, Any]] = {
    "free": {"includes_training": False, "max_concurrent_runs": 0, "max_gpus_per_run": 0},
    "team": {"includes_training": True, "max_concurrent_runs": 2, "max_gpus_per_run": 8},
}


class Command(BaseCommand):
    help = "Create the demo admin user, plans, project and token; build the tiny demo models."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(PRODUCTION_FLAG, dest="production", action="store_true",
                            help="run without DEBUG=1: creates only what is missing, and never an admin password of its own")

    def handle(self, *args, **opts) -> None:
        if not settings.DEBUG and not opts["production"]:
            raise CommandError(
                "bootstrapdemo sets up a demo (an admin user, plans, a project and its token), and DEBUG is off, so this "
                f"looks like a production Studio: run it with DEBUG=1, or pass {PRODUCTION_FLAG} to create only what is "
                "missing (it changes no existing plan, user or password)"
            )
        username = os.environ.get("STUDIO_ADMIN_USER", "admin")
        user, password = self.admin_user(username)
        plans = {name: Plan.objects.filter(name=name).first() or create_plan(name, **limits) for name, limits in DEMO_PLANS.items()}
        project = Project.objects.filter(slug="demo").first() or create_project("demo", owner=user, plan=plans["team"])
        self.build_demo_models()
        self.demo_repos(project, user)
        if not project.api_tokens.filter(user=user, revoked_at__isnull=True).exists():
            _, plaintext = create_api_token(user, project, name="demo")
            (settings.VAR_DIR / "demo-token").write_text(plaintext + "\n")
            self.stdout.write(f"API token for project demo (also in var/demo-token): {plaintext}")
        base = f"http://{os.environ.get('STUDIO_ADDR', '127.0.0.1:8000')}"  # where runstudio serves
        login = f"{username} / {password}" if password else username
        self.stdout.write(f"Log in at {base}/ as {login}; the admin console for plans is {base}/admin/, the API docs {base}/api/docs")

    def admin_user(self, username: str) -> tuple[AbstractBaseUser, str | None]:
        """The admin user, made if missing, and the password to show: only one this call set, on a DEBUG Studio."""
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is not None:
            return user, None
        password = os.environ.get("STUDIO_ADMIN_PASSWORD") or None  # set but empty is not a password either
        if password is None and not settings.DEBUG:
            raise CommandError(f"there is no user {username!r} to own the demo project: set STUDIO_ADMIN_PASSWORD to create it (or STUDIO_ADMIN_USER to use an existing user)")
        password = password or "admin"
        user = User.objects.create_superuser(username, f"{username}@localhost", password)
        if not settings.DEBUG:
            self.stdout.write(f"created admin user {username!r} with the password in STUDIO_ADMIN_PASSWORD")
            return user, None
        self.stdout.write(f"created admin user {username!r} with password {password!r}")
        return user, password

    def build_demo_models(self) -> None:
        marker = demo_marker()  # NEW RUN suggests what it lists (training/suggestions.py)
        models_dir = marker.parent
        try:
            from training.engine.tiny import build_demo_datasets, build_tiny_models
        except ImportError:
            self.stdout.write("the trainer engine is not installed: skipping the tiny demo models")
            return
        recorded = demo_recorded()
        elsewhere = demo_elsewhere(recorded)
        if elsewhere:
            self.stdout.write(f"{marker} lists {elsewhere[0]}, which is not in this Studio's {models_dir} (a var/ moved or copied "
                              "from another place): building the demo models and datasets here again")
        if not recorded or elsewhere:
            built = {**build_tiny_models(models_dir), **build_demo_datasets(models_dir / "datasets")}
            marker.write_text(json.dumps(built, indent=2))
            self.stdout.write("built the tiny demo models and datasets:")
        for name, path in json.loads(marker.read_text()).items():
            self.stdout.write(f"  {name}: {path}")

    def demo_repos(self, project: Project, user: AbstractBaseUser) -> None:
        """The demo models and datasets as Data Hub repos of `project` (demo-student@main, demo-dpo@main,
        ...): the Data Hub, its previews and refs are there to try from the first page, and a run can
        name them as it would a team's own. Each is committed once: var/demo/hub.json lists the repos
        made, so one a user deleted or changed is theirs and stays as they left it."""
        built = demo_built()
        if not built:
            return  # no engine, so no demo files
        made_file = demo_marker().parent / "hub.json"
        try:
            made = set(json.loads(made_file.read_text()))
        except (OSError, ValueError):
            made = set()
        for name, path in built.items():
            repo_name = demo_repo_name(name)
            if repo_name in made or Repo.objects.filter(project=project, name__iexact=repo_name).exists():
                continue  # made before, or the team has a repo of that name (in any case)
            kind, what = (RepoType.MODEL, "random weights") if path.is_dir() else (RepoType.DATASET, "generated rows")
            repo = create_repo(project, repo_name, kind, user, description=f"The tiny demo {name} {kind} bootstrapdemo built ({what}, for trying the Studio)")
            files = {str(f.relative_to(path)): f for f in sorted(path.rglob("*")) if f.is_file()} if path.is_dir() else {path.name: path}
            commit_files(repo, repo.default_branch, files, f"The demo {name} {kind}", author=user)
            made.add(repo_name)
            self.stdout.write(f"  Data Hub: {project.slug}/{repo_name}@{repo.default_branch}")
        made_file.write_text(json.dumps(sorted(made)))
