"""Permission-scoped lookups. An outsider never sees another project's rows (404, not 403)."""
from __future__ import annotations

from django.db.models import QuerySet

from studio.models import ApiToken, Membership, Project, Role


def projects_for(user) -> QuerySet[Project]:
    if not user or not user.is_authenticated:
        return Project.objects.none()
    return Project.objects.filter(memberships__user=user)


def membership(user, project: Project) -> Membership | None:
    if not user or not user.is_authenticated:
        return None
    return Membership.objects.filter(user=user, project=project).first()


def tokens_for(user, project: Project) -> QuerySet[ApiToken]:
    """The API tokens `user` may see and revoke in `project`: their own; an owner's, everyone's there
    (they manage who can reach the project, so they can cut off a leaked token without an administrator).
    Another project's tokens are never in it."""
    tokens = ApiToken.objects.filter(project=project).select_related("user")
    member = membership(user, project)
    if member is None:
        return tokens.none()
    return tokens if member.role == Role.OWNER else tokens.filter(user=user)
