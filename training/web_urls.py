from __future__ import annotations

from django.urls import path

from training import playground_views, views

app_name = "training"
urlpatterns = [
    path("training/", views.runs, name="runs"),
    path("training/new/", views.new_run, name="new"),
    path("training/new/<slug:part>", views.new_run_part, name="new_part"),
    path("training/runs/<int:run_id>/", views.run_detail, name="run"),
    path("training/runs/<int:run_id>/edit/", views.edit_run, name="edit"),
    path("training/runs/<int:run_id>/like/", views.new_run_like, name="like"),
    path("training/runs/<int:run_id>/status", views.run_status, name="status"),
    path("training/runs/<int:run_id>/live", views.run_live, name="live"),
    path("training/runs/<int:run_id>/log", views.run_log, name="log"),
    path("training/runs/<int:run_id>/log.txt", views.run_log_text, name="log_text"),
    path("training/runs/<int:run_id>/start", views.start, name="start"),
    path("training/runs/<int:run_id>/stop", views.stop, name="stop"),
    path("training/runs/<int:run_id>/delete", views.delete, name="delete"),
    path("training/runs/<int:run_id>/checkpoints/<int:step>/resume", views.resume_checkpoint, name="resume"),
    path("training/runs/<int:run_id>/checkpoints/<int:step>/merge", views.merge_checkpoint, name="merge"),
    path("training/runs/<int:run_id>/generate", playground_views.generate, name="generate"),
    path("training/runs/<int:run_id>/generations/<int:generation_id>", playground_views.generation, name="generation"),
    path("training/runs/<int:run_id>/<slug:tab>/", views.run_detail, name="run_tab"),
]
