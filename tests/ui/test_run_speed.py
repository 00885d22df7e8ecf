"""Per-step speed figures (tokens/s, ETA, MFU, GPU memory) travel through ingest onto the run's Overview.
Server-side (Django's test client): the figures are plain text in their own card beside the status
area, which the status area's poll answer brings out of band while the area itself stays the same."""
from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from studio import crypto
from training import services
from training.models import MetricPoint, Status, TrainingRun

pytestmark = pytest.mark.django_db


def started_run(project, user) -> tuple[TrainingRun, str]:
    run = services.create_run(project, user, name="speedy", method="sft", base_model="org/base", dataset="my-data@main", config={"lora_rank": 16})
    token = crypto.new_token("ing")
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.PROVISIONING, attempt=1, ingest_token_hash=crypto.hash_token(token))
    return run, token


def ingest(run: TrainingRun, token: str, progress: dict, metrics: list[dict]) -> None:
    body = {"batch_id": f"b{len(metrics)}-{len(progress)}", "status": "running", "stage": "train", "progress": progress, "metrics": metrics}
    r = Client().post(f"/api/ingest/runs/{run.pk}", data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert r.status_code == 200, r.content


def overview(run: TrainingRun, user) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/training/runs/{run.pk}/")
    assert response.status_code == 200
    return response.content.decode()


HTMX = {"HTTP_HX_REQUEST": "true"}


def figures_card(html: str) -> str:
    return html[html.index('id="run-figures"'):html.index('id="tab-panel"')]


def test_gpu_speed_figures_reach_the_overview(project, users):
    run, token = started_run(project, users["owner"])
    progress = {"step": 30, "max_steps": 100, "tokens_per_s": 87123.4, "step_time_s": 0.75, "eta_s": 52.5, "mfu": 31.24, "gpu_memory_gb": 12.34}
    metrics = [{"step": s, "key": k, "value": v} for s in range(1, 31) for k, v in (("tokens_per_s", 87000.0), ("mfu", 31.0 + s / 100), ("gpu_memory_gb", 12.3))]
    ingest(run, token, progress, metrics)

    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.progress == progress  # ingest keeps every progress key
    assert MetricPoint.objects.filter(run=run, key="mfu").count() == 30

    html = overview(run, users["viewer"])
    card = figures_card(html)
    assert "87123 tokens/s" in card and "ETA" in card
    assert "MFU 31.2 %" in card and "GPU memory 12.3 GB" in card
    mfu = re.search(r'<span data-testid="run-mfu" title="([^"]*)"', card)
    assert mfu and "share of the GPU's dense bf16 peak" in mfu.group(1) and "speed of light" in mfu.group(1)
    captions = re.findall(r"<figcaption>([^<]*)</figcaption>", html)
    assert captions == ["Training loss", "Throughput (tokens/s)", "Speed of light (MFU %)", "GPU memory (GB)"]


def test_a_run_without_gpu_figures_shows_neither(project, users):
    run, token = started_run(project, users["owner"])
    ingest(run, token, {"step": 3, "max_steps": 10, "tokens_per_s": 950.0, "step_time_s": 0.2, "eta_s": 1.4}, [{"step": 3, "key": "tokens_per_s", "value": 950.0}])

    html = overview(run, users["owner"])
    card = figures_card(html)
    assert "950 tokens/s" in card and "ETA" in card
    assert "MFU" not in html and "GPU memory" not in html and 'data-testid="run-mfu"' not in html
    assert re.findall(r"<figcaption>([^<]*)</figcaption>", html) == ["Training loss", "Throughput (tokens/s)"]


def test_grpo_rollout_speed_gets_its_own_chart(project, users):
    run, token = started_run(project, users["owner"])
    TrainingRun.objects.filter(pk=run.pk).update(method="grpo")
    metrics = [{"step": s, "key": k, "value": v} for s in range(1, 6) for k, v in (("reward", 0.1 * s), ("rollout/tokens_per_s", 9000.0 + s))]
    ingest(run, token, {"step": 5, "max_steps": 10}, metrics)

    captions = re.findall(r"<figcaption>([^<]*)</figcaption>", overview(run, users["owner"]))
    assert "Rollout speed (tokens/s)" in captions and captions[0] == "Reward"


def test_a_distill_runs_teacher_capture_shows_its_shards_and_speed(project, users):
    run, token = started_run(project, users["owner"])
    ingest(run, token, {"capture_shards_done": 2, "capture_shards": 5, "capture_tokens_per_s": 41234.6}, [])
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.started_at is not None  # the capture counts in the run's duration
    card = figures_card(overview(run, users["viewer"]))
    assert 'data-testid="capture-progress"' in card and "shard 2 / 5 · 41235 tokens/s · training starts after it" in card


def test_a_training_runs_status_poll_keeps_its_status_area_while_only_the_figures_move(project, users):
    """Step, tokens/s and ETA change every step: were they in the status area, every 2-second poll
    answer would differ, and the page swapped it in (STOP refocused) at each one."""
    run, token = started_run(project, users["owner"])
    ingest(run, token, {"step": 1, "max_steps": 10}, [])  # running
    client = Client()
    client.force_login(users["owner"])
    answers = []
    for step, speed, eta in ((3, 950.0, 14.0), (7, 990.0, 6.0)):  # as each step's ingest writes them
        TrainingRun.objects.filter(pk=run.pk).update(progress={"step": step, "max_steps": 10, "tokens_per_s": speed, "step_time_s": 0.2, "eta_s": eta})
        response = client.get(f"/training/runs/{run.pk}/status", {"seen": ""}, **HTMX)
        assert response.status_code == 200
        answers.append(response.content.decode())

    areas = [re.sub(r'(name="csrfmiddlewaretoken" value=")[^"]*"', r'\1"', a[:a.index("</section>")]) for a in answers]
    assert areas[0] == areas[1], "the status area's markup moved with the step"
    assert 'id="stop-btn"' in areas[0] and "step " not in areas[0] and "tokens/s" not in areas[0]
    figures = [a[a.index("</section>"):] for a in answers]
    assert all('<div id="run-figures" class="card run-figures" hx-swap-oob="true">' in f for f in figures)
    assert "step 3 / 10" in figures[0] and "950 tokens/s" in figures[0]
    assert "step 7 / 10" in figures[1] and "990 tokens/s" in figures[1] and "ETA" in figures[1]
    assert all("aria-live" not in f and "stop-btn" not in f for f in figures)
