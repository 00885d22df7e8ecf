import django.db.models.functions.text
from django.db import migrations, models


def refuse_names_that_differ_only_in_case(apps, schema_editor):
    """The constraint below cannot be made while a project has such repos: say which, and what to do."""
    Repo = apps.get_model("datahub", "Repo")
    seen: dict[tuple[int, str], str] = {}
    clashes = []
    for project_id, slug, name in Repo.objects.order_by("project_id", "name").values_list("project_id", "project__slug", "name"):
        key = (project_id, name.lower())
        if key in seen:
            clashes.append(f"{slug}/{seen[key]} and {slug}/{name}")
        else:
            seen[key] = name
    if clashes:
        raise RuntimeError(
            "Data Hub repo names must now differ in more than case within a project, and these do not: " + "; ".join(clashes)
            + ". Delete one of each pair (its Delete on the repo page, or DELETE /api/hub/repos/<name>) after copying what it holds "
            "to a repo of another name, then run migrate again.")


class Migration(migrations.Migration):

    dependencies = [
        ('datahub', '0006_upload_session_outlives_repo'),
    ]

    operations = [
        migrations.RunPython(refuse_names_that_differ_only_in_case, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='repo',
            constraint=models.UniqueConstraint(django.db.models.functions.text.Lower('name'), models.F('project'), name='hub_repo_name_per_project_any_case'),
        ),
    ]
