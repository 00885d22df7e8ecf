from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from studio.auth import current_project_for_session
from training.models import TrainingRun


@login_required
def home(request: HttpRequest) -> HttpResponse:
    project = current_project_for_session(request)
    runs = TrainingRun.objects.filter(project=project).select_related("experiment")[:50] if project else []
    return render(request, "studio/home.html", {"project": project, "runs": runs})
