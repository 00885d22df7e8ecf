"""Set up the embedded demo: an admin user, plans, a project, a token, and (when the engine is
present) a tiny student/teacher model pair and demo datasets built offline. Safe to run again."""
from __future__ import annotations

import json
import os

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from studio.models import Project
from studio.services import create_api_token, create_plan, create_project
from training.suggestions import demo_marker


class Command(BaseCommand):
    help = "Create the demo admin user, plans, project and token; build the tiny demo models."

    def handle(self, *args, **opts) -> None:
        User = get_user_model()
        username = os.environ.get("STUDIO_ADMIN_USER", "admin")
        password = os.environ.get("STUDIO_ADMIN_PASSWORD", "admin")
        user = User.objects.filter(username=username).first()
        if user is None:
            user = User.objects.create_superuser(username, f"{username}@localhost", password)
            self.stdout.write(f"created admin user {username!r} with password {password!r}")
        create_plan("free", includes_training=False, max_concurrent_runs=0, max_gpus_per_run=0)
        team = create_plan("team", includes_training=True, max_concurrent_runs=2, max_gpus_per_run=8)
        project = Project.objects.filter(slug="demo").first() or create_project("demo", owner=user, plan=team)
        marker = demo_marker()  # NEW RUN suggests what it lists (training/suggestions.py)
        models_dir = marker.parent
        try:
            from training.engine.tiny import build_demo_datasets, build_tiny_models
        except ImportError:
            self.stdout.write("the trainer engine is not installed: skipping the tiny demo models")
        else:
            if not marker.exists():
                built = {**build_tiny_models(models_dir), **build_demo_datasets(models_dir / "datasets")}
                marker.write_text(json.dumps(built, indent=2))
                self.stdout.write("built the tiny demo models and datasets:")
            for name, path in json.loads(marker.read_text()).items():
                self.stdout.write(f"  {name}: {path}")
        if not project.api_tokens.filter(user=user, revoked_at__isnull=True).exists():
            _, plaintext = create_api_token(user, project, name="demo")
            (settings.VAR_DIR / "demo-token").write_text(plaintext + "\n")
            self.stdout.write(f"API token for project demo (also in var/demo-token): {plaintext}")
        base = f"http://{os.environ.get('STUDIO_ADDR', '127.0.0.1:8000')}"  # where runstudio serves
        self.stdout.write(f"Log in at {base}/ as {username} / {password}; the admin console for plans is {base}/admin/, the API docs {base}/api/docs")
