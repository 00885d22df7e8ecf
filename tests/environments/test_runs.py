"""Issue 6's acceptance through the REST API on the local backend (a real Celery worker, real engine):
GRPO in Environment mode with the FORKED maths environment reports its rewards; a package whose
load_environment raises fails the run before the first step with the traceback in error.log_tail; a
RULER run scores its rollouts with an external judge served by a local OpenAI-compatible test server,
and the judge's API key appears in no API response, page, log line, run file or run config."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client
from django.utils.html import escape

from datahub.commits import commit_files
from datahub.models import RepoType
from datahub.repos import create_repo
from tests.conftest import wait_for
from tests.environments.test_engine_envs import KEY, JudgeServer
from training.models import LogLine, MetricPoint, Status, TrainingRun

pytestmark = pytest.mark.worker
FAST = {"max_steps": 3, "learning_rate": 1e-2, "rollouts_per_prompt": 4, "max_response_length": 8, "rollout_log_steps": 1,
        "heartbeat_interval_seconds": 2}


def start_and_wait(api, body: dict, timeout: float = 240) -> TrainingRun:
    r = api.post("/api/training-runs", body)
    assert r.status_code == 201, r.content
    run_id = r.json()["id"]
    r = api.post(f"/api/training-runs/{run_id}/start")
    assert r.status_code == 202, r.content
    wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status__in=(Status.COMPLETED, Status.FAILED, Status.CANCELLED)).exists(),
             timeout, interval=0.25, message=f"run {run_id} to finish")
    return TrainingRun.objects.get(pk=run_id)


def logs(run: TrainingRun) -> list[str]:
    return list(LogLine.objects.filter(run=run).order_by("id").values_list("line", flat=True))


def series(run: TrainingRun, key: str) -> list[float]:
    return list(MetricPoint.objects.filter(run=run, key=key).order_by("step").values_list("value", flat=True))


def test_grpo_with_the_forked_maths_environment_reports_its_rewards(api, studio_worker, tiny_models):
    fork = api.post("/api/environments/fork", {"catalogue": "gsm-maths", "name": "my-maths"}).json()
    run = start_and_wait(api, {"name": "maths", "method": "grpo", "base_model": tiny_models["student"],
                               "config": {**FAST, "environment_id": "my-maths@main"}})
    assert run.status == Status.COMPLETED, (run.error, logs(run)[-40:])
    assert run.pinned["config.environment_id"]["commit"] == fork["commit"]
    assert any(f"acme/my-maths@{fork['commit'][:12]}" in line for line in logs(run)), logs(run)
    assert len(series(run, "reward")) == 3
    for key in ("rewards/correct", "rewards/close", "rewards/format"):
        assert len(series(run, key)) == 3, key
    rollouts = api.get(f"/api/training-runs/{run.pk}/rollouts").json()["items"]
    assert len(rollouts) == 12 and all(set(r["components"]) == {"correct", "close", "format"} for r in rollouts)
    # the prompts are the fork's own data, under the fork's system prompt
    questions = {json.loads(line)["question"] for line in (Path(__file__).parents[2] / "environments/catalogue/gsm_maths/data.jsonl").read_text().splitlines()}
    assert all(any(q in r["prompt"] for q in questions) for r in rollouts)


def test_a_package_whose_load_environment_raises_fails_before_the_first_step(api, project, studio_worker, tiny_models):
    repo = create_repo(project, "boom-env", RepoType.ENVIRONMENT)
    commit_files(repo, "main", {"__init__.py": b"def load_environment(**kwargs):\n    raise ValueError('the shard data/train-0003.jsonl is missing')\n"})
    run = start_and_wait(api, {"name": "boom", "method": "grpo", "base_model": tiny_models["student"],
                               "config": {**FAST, "environment_id": "boom-env@main"}})
    assert run.status == Status.FAILED, run.status
    assert run.error["code"] == "training_error"
    assert "the shard data/train-0003.jsonl is missing" in run.error["message"]
    tail = "\n".join(run.error["log_tail"])
    assert "Traceback (most recent call last)" in tail and "raise ValueError('the shard data/train-0003.jsonl is missing')" in tail, tail
    # before the first step: no step was reported (the run went running as its engine started, before the load)
    assert not MetricPoint.objects.filter(run=run).exists()
    assert not any(line.startswith("step ") for line in logs(run)), logs(run)
    assert not (run.progress or {}).get("step")


def test_a_config_saved_for_a_package_whose_init_defines_config_is_the_one_the_run_uses(api, users, project, studio_worker, tiny_models):
    # The README lets __init__.py define CONFIG. A save went to a new config.py, which GET config, the
    # check and the run's Environment tab showed, while the run kept __init__.py's CONFIG (n: 8).
    repo = create_repo(project, "count-env", RepoType.ENVIRONMENT)
    init = (b'CONFIG = {"n": 8}  # prompts to train on\n\n\n'
            b"class Counting:\n    def rows(self):\n        return [{'prompt': f'Count to {i}.'} for i in range(CONFIG['n'])]\n\n"
            b"    def score(self, row, completion):\n        return {'n': CONFIG['n'] / 10}\n\n\n"
            b"def load_environment(**kwargs):\n    return Counting()\n")
    commit_files(repo, "main", {"__init__.py": init})
    saved = api.put("/api/environments/count-env/config", {"config": {"n": 1}})
    assert saved.status_code == 200, saved.content
    shown = api.get("/api/environments/count-env/config").json()
    assert shown["config"] == {"n": 1}
    assert api.get("/api/environments/count-env/check").json()["findings"] == []
    run = start_and_wait(api, {"name": "count", "method": "grpo", "base_model": tiny_models["student"],
                               "config": {**FAST, "environment_id": "count-env@main"}})
    assert run.status == Status.COMPLETED, (run.error, logs(run)[-40:])
    assert run.pinned["config.environment_id"]["commit"] == saved.json()["commit"]
    rollouts = api.get(f"/api/training-runs/{run.pk}/rollouts").json()["items"]
    assert rollouts and all(r["components"] == {"n": 0.1} and "Count to 0." in r["prompt"] for r in rollouts), rollouts[:2]
    browser = Client()
    browser.force_login(users["owner"])
    assert escape('{"n": 1}') in browser.get(f"/training/runs/{run.pk}/environment/").content.decode()  # the Environment tab's CONFIG
    assert shown["files"] == ["__init__.py"]  # edited where it is defined, not in a config.py beside it


def test_ruler_run_scores_rollouts_with_an_external_judge_and_never_shows_its_key(api, users, project, studio_worker, tiny_models, tmp_path):
    judge = JudgeServer()
    try:
        assert api.put("/api/secrets/judge-key", {"value": KEY}).status_code == 204
        data = tmp_path / "prompts.jsonl"
        data.write_text("\n".join(json.dumps({"prompt": p}) for p in ("Write a kind greeting.", "Describe the sea.")) + "\n")
        config = {**FAST, "rl_mode": "ruler", "ruler_task_args": {"dataset": str(data), "system_prompt": "Be warm and detailed."},
                  "judge": {"mode": "external", "endpoint": judge.url, "model": "judge-1", "api_key_secret": "judge-key"}}
        run = start_and_wait(api, {"name": "ruler", "method": "grpo", "base_model": tiny_models["student"], "config": config})
    finally:
        judge.close()
    assert run.status == Status.COMPLETED, (run.error, logs(run)[-40:])
    assert len(judge.requests) == 3 and all(r["auth"] == f"Bearer {KEY}" for r in judge.requests)
    rollouts = api.get(f"/api/training-runs/{run.pk}/rollouts").json()["items"]
    assert len(rollouts) == 12 and all(set(r["components"]) == {"judge"} for r in rollouts)
    assert len(series(run, "reward")) == 3 and len(series(run, "rewards/judge")) == 3

    # The key is nowhere: API responses, pages, log lines, the run's stored config, files, the worker log.
    seen = []
    for path in ("", "/metrics", "/rollouts", "/checkpoints"):
        seen.append(api.get(f"/api/training-runs/{run.pk}{path}").content.decode())
    seen.append(api.get(f"/api/training-runs/{run.pk}/logs", full="true").content.decode())
    seen += [api.get("/api/training-runs").content.decode(), api.get("/api/secrets").content.decode()]
    browser = Client()
    browser.force_login(users["owner"])
    for tab in ("", "configuration/", "logs/", "rollouts/", "environment/"):
        page = browser.get(f"/training/runs/{run.pk}/{tab}")
        seen.append(page.content.decode(errors="replace"))
        if tab == "configuration/":
            assert page.status_code == 200 and "judge-key" in seen[-1] and judge.url in seen[-1]  # the judge block is shown, by secret name
    seen.append(json.dumps(run.config) + json.dumps(run.error) + json.dumps(run.pinned))
    seen += logs(run)
    seen.append(studio_worker.log())
    for file in Path(studio_worker.runs_dir).rglob("*"):
        if file.is_file():
            seen.append(file.read_bytes().decode(errors="replace"))
    assert KEY not in "\n".join(seen)


def test_a_remote_ruler_run_reads_every_prompts_file_of_its_data_hub_dataset(transactional_db, live_server, api, project, tokens, tmp_path, monkeypatch, settings):
    """START checks every file of a RULER run's prompts repo, so a dstack/Modal job reads every one
    from /hub: not the Hub's split-by-file-name rule, which found no train split in data.jsonl +
    test.jsonl."""
    from environments.services import job_environment
    from training.engine.ruler import API_KEY_ENV, RulerEnvironment
    from training.engine.spec import parse_spec

    settings.STUDIO_PUBLIC_URL = live_server.url
    repo = create_repo(project, "prompts", RepoType.DATASET)
    files = {"data.jsonl": ["Greet a friend.", "Describe the sea."], "test.jsonl": ["Thank a colleague."]}
    commit = commit_files(repo, "main", {name: "".join(json.dumps({"prompt": p}) + "\n" for p in prompts).encode() for name, prompts in files.items()})
    config = {"rl_mode": "ruler", "ruler_task_args": {"dataset": "prompts@main", "system_prompt": "Be warm."},
              "judge": {"mode": "external", "endpoint": "http://judge.example/v1", "model": "judge-1", "api_key_secret": "judge-key"}}
    r = api.post("/api/training-runs", {"name": "remote ruler", "method": "grpo", "base_model": "org/base", "config": config,
                                        "compute": {"backend": "dstack", "accelerators": "H100:1"}})
    assert r.status_code == 201, r.content
    run = TrainingRun.objects.get(pk=r.json()["id"])
    run.pinned = {"config.ruler_task_args.dataset": {"ref": "prompts@main", "commit": commit.pk, "repo": "acme/prompts"}}
    block = job_environment(run)
    assert block == {"id": "builtin/ruler_task", "ruler_dataset": {"path": "acme/prompts", "revision": commit.pk, "data_hub": True}}
    monkeypatch.setenv("HF_ENDPOINT", f"{live_server.url}/hub")
    monkeypatch.setenv("HF_TOKEN", tokens["owner"])
    monkeypatch.setenv(API_KEY_ENV, "sk-test")
    spec = parse_spec({"method": "grpo", "base_model": "x", "output_dir": str(tmp_path / "out"), "config": run.config, "environment": block})
    env = RulerEnvironment.from_spec(spec, block, log=lambda line: None)
    assert [row["prompt"] for row in env.rows] == [*files["data.jsonl"], *files["test.jsonl"]]


def test_remote_backends_fetch_the_pinned_commit_through_the_hub_api(transactional_db, live_server, api, project, tokens, tmp_path, monkeypatch, settings):
    """What a dstack/Modal job does: no staged path, so the engine downloads repo@commit from /hub."""
    from environments.services import job_environment
    from training.engine.environments import environment_for
    from training.engine.spec import parse_spec

    settings.STUDIO_PUBLIC_URL = live_server.url
    fork = api.post("/api/environments/fork", {"catalogue": "multiple-choice", "name": "mc"}).json()
    run_id = api.post("/api/training-runs", {"name": "remote", "method": "grpo", "base_model": "org/base",
                                             "config": {"environment_id": "mc@main", "inference_blocks": 1, "trainer_blocks": 1},
                                             "compute": {"backend": "dstack", "accelerators": "H100:2"}}).json()["id"]
    run = TrainingRun.objects.get(pk=run_id)
    run.pinned = {"config.environment_id": {"ref": "mc@main", "commit": fork["commit"], "repo": "acme/mc"}}
    block = job_environment(run)
    assert block == {"id": "mc@main", "repo": "acme/mc", "commit": fork["commit"], "hub_url": f"{live_server.url}/hub"}
    monkeypatch.setenv("HF_TOKEN", tokens["owner"])
    spec = parse_spec({"method": "grpo", "base_model": "x", "output_dir": str(tmp_path / "out"), "config": run.config, "environment": block})
    env = environment_for(spec)
    assert (tmp_path / "out" / "environment" / "config.py").is_file()
    row = env.prompts(1, 0)[0]
    assert env.score(row, f"Answer: {row['answer']}")["total"] == pytest.approx(1.0)
    # a catalogue id on a remote backend carries its files inline
    run.config = {**run.config, "environment_id": "builtin/science-qa@main"}
    block = job_environment(run)
    assert "path" not in block and {"__init__.py", "config.py", "data.jsonl"} <= set(block["files"])


def test_the_system_prompt_a_catalogue_environment_sets_itself_is_reported_and_shown(api, users, studio_worker, tiny_models):
    # gsm-maths puts its own system prompt before each question; the run's config names none, so only
    # the engine knows it: the Rollouts tab and the run's attempts show the one the rollouts were made with.
    from environments.catalogue.gsm_maths.config import CONFIG

    run = start_and_wait(api, {"name": "maths prompt", "method": "grpo", "base_model": tiny_models["student"],
                               "config": {**FAST, "environment_id": "builtin/gsm-maths@main"}}, timeout=480)
    assert run.status == Status.COMPLETED, (run.error, logs(run)[-40:])
    assert "system_prompt" not in run.config
    assert [a["system_prompt"] for a in api.get(f"/api/training-runs/{run.pk}/attempts").json()] == [CONFIG["system_prompt"]]
    browser = Client()
    browser.force_login(users["owner"])
    html = browser.get(f"/training/runs/{run.pk}/rollouts/").content.decode()
    shown = re.search(r'<p class="prompt" data-testid="system-prompt">(.*?)</p>', html, re.S)
    assert shown, html[-3000:]
    assert "set by the environment builtin/gsm-maths@main itself" in shown.group(1) and escape(CONFIG["system_prompt"]) in shown.group(1)
