"""Checkpoint.publish_error, and its value for the runs whose publish the old model repo name made
fail: a run named "Experiment…" had its model repo named experiment-…-run<id>, which create_repo keeps
for experiments' repos, so nothing was published and the Overview called the repo "deleted"."""

from __future__ import annotations

from django.db import migrations, models
from django.utils.text import slugify

REFUSED = (
    "its model repo name {name} started with experiment-, kept for the experiments' own repos, so no repo was made "
    "(a Studio since fixed: a run named so now publishes to model-{name})"
)


def mark_refused_publishes(apps, schema_editor):
    Checkpoint = apps.get_model("training", "Checkpoint")
    Repo = apps.get_model("datahub", "Repo")
    for checkpoint in Checkpoint.objects.filter(kind__in=("final", "merged")).exclude(commit="").select_related("run").iterator():
        run = checkpoint.run
        name = f"{(slugify(run.name) or 'model')[:100].strip('-_') or 'model'}-run{run.pk}"  # model_repo_name as it was
        if name.startswith("experiment-") and not Repo.objects.filter(project_id=run.project_id, name=name).exists():
            Checkpoint.objects.filter(pk=checkpoint.pk).update(publish_error=REFUSED.format(name=name)[:500])


class Migration(migrations.Migration):
    dependencies = [
        ("training", "0015_generation"),
        ("datahub", "0007_repo_name_any_case"),
    ]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="publish_error",
            field=models.CharField(blank=True, default="", max_length=500),
        ),
        migrations.RunPython(mark_refused_publishes, migrations.RunPython.noop),
    ]
