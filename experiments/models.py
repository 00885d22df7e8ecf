from __future__ import annotations

from django.db import models

from studio.models import Project


class Experiment(models.Model):
    """A group of runs. Each experiment maps to one Data Hub repo; each run is a branch in it."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="experiments")
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100)
    # Filled by datahub.services.provision_experiment_repo (the Data Hub issue).
    hub_repo = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "slug"], name="experiment_slug_per_project")]
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.slug}"
