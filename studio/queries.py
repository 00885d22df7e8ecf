"""Permission-scoped lookups. An outsider never sees another project's rows (404, not 403)."""
from __future__ import annotations

from django.db.models import QuerySet

from studio.models import Membership, Project


def projects_for(user) -> QuerySet[Project]:
    if not user or not user.is_authenticated:
        return Project.objects.none()
    return Project.objects.filter(memberships__user=user)


def membership(user, project: Project) -> Membership | None:
    if not user or not user.is_authenticated:
        return None
    return Membership.objects.filter(user=user, project=project).first()
