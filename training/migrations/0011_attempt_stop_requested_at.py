from django.db import migrations, models


def marks_to_attempts(apps, schema_editor):
    """A run's pending stop was its current attempt's: the mark moves onto that attempt's record."""
    TrainingRun = apps.get_model("training", "TrainingRun")
    RunAttempt = apps.get_model("training", "RunAttempt")
    for run in TrainingRun.objects.filter(stop_requested_at__isnull=False, attempt__gt=0):
        RunAttempt.objects.update_or_create(run=run, attempt=run.attempt, defaults={"stop_requested_at": run.stop_requested_at}, create_defaults={
            "stop_requested_at": run.stop_requested_at, "base_model": run.base_model, "dataset": run.dataset, "config": run.config,
            "compute": run.compute, "pinned": run.pinned,
        })


def marks_to_runs(apps, schema_editor):
    TrainingRun = apps.get_model("training", "TrainingRun")
    RunAttempt = apps.get_model("training", "RunAttempt")
    for attempt in RunAttempt.objects.filter(stop_requested_at__isnull=False).order_by("stop_requested_at"):
        TrainingRun.objects.filter(pk=attempt.run_id).update(stop_requested_at=attempt.stop_requested_at)


class Migration(migrations.Migration):

    dependencies = [
        ('training', '0010_run_stop_requested_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='runattempt',
            name='stop_requested_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(marks_to_attempts, marks_to_runs),
        migrations.RemoveField(
            model_name='trainingrun',
            name='stop_requested_at',
        ),
    ]
