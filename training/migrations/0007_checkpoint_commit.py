from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('training', '0006_checkpoint_requested'),
    ]

    operations = [
        migrations.AddField(
            model_name='checkpoint',
            name='commit',
            field=models.CharField(blank=True, default='', max_length=40),
        ),
    ]
