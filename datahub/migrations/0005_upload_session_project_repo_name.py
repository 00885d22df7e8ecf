from django.db import migrations, models
from django.db.models import OuterRef, Subquery
import django.db.models.deletion


def fill_project_and_repo_name(apps, schema_editor):
    """Each existing session's project and repo name, from its repo (every session has one so far)."""
    UploadSession = apps.get_model("datahub", "UploadSession")
    Repo = apps.get_model("datahub", "Repo")
    repo = Repo.objects.filter(pk=OuterRef("repo_id"))
    UploadSession.objects.update(project_id=Subquery(repo.values("project_id")[:1]), repo_name=Subquery(repo.values("name")[:1]))


class Migration(migrations.Migration):

    dependencies = [
        ('studio', '0001_initial'),
        ('datahub', '0004_upload_abort_reason'),
    ]

    operations = [
        migrations.AddField(
            model_name='uploadsession',
            name='project',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='studio.project'),
        ),
        migrations.AddField(
            model_name='uploadsession',
            name='repo_name',
            field=models.CharField(default='', max_length=128),
            preserve_default=False,
        ),
        migrations.RunPython(fill_project_and_repo_name, migrations.RunPython.noop),
    ]
