"""The ingest API: per-attempt token, idempotent batches, reported statuses through the status service."""
from __future__ import annotations

import json

import pytest
from django.test import Client

from studio import crypto
from tests.conftest import sft_body
from training.backends.local import output_dir
from training.models import LOG_LINE_CHARS, Checkpoint, IngestBatch, LogLine, MetricPoint, Rollout, RunAttempt, Status, TrainingRun


@pytest.fixture
def live_run(api):
    """A provisioning run with a known ingest token for its attempt 1."""
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    token = crypto.new_token("ing")
    TrainingRun.objects.filter(pk=run_id).update(status=Status.PROVISIONING, attempt=1, ingest_token_hash=crypto.hash_token(token))
    return TrainingRun.objects.get(pk=run_id), token


def send(run_id: int, token: str | None, body: dict):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return Client().post(f"/api/ingest/runs/{run_id}", data=json.dumps(body), content_type="application/json", **headers)


def out(run, folder: str) -> str:
    """A folder in the run attempt's output folder, where its engine saves (the ingest refuses others)."""
    return str(output_dir(run.pk, run.attempt) / folder)


def batch(run, **changes) -> dict:
    """A batch of everything, its checkpoint in the run's own output folder."""
    return {**BATCH, "checkpoints": [{"step": 2, "path": out(run, "checkpoint-2"), "kind": "checkpoint"}], **changes}


BATCH = {
    "batch_id": "b1",
    "metrics": [{"step": 1, "key": "loss", "value": 2.5}, {"step": 2, "key": "loss", "value": 2.0}],
    "logs": ["step 1", "step 2"],
    "rollouts": [{"step": 1, "prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": 0.5, "components": {"exact": 1.0}}],
    "stage": "train",
    "status": "running",
    "progress": {"step": 2, "max_steps": 10, "tokens_per_s": 1000.0, "eta_s": 8},
}


def test_a_batch_lands_whole_and_moves_the_run_to_running(live_run):
    run, token = live_run
    r = send(run.pk, token, batch(run))
    assert r.status_code == 200 and r.json() == {"ok": True, "duplicate": False}
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.stage == "train" and run.progress["step"] == 2 and run.last_heartbeat_at
    assert list(MetricPoint.objects.filter(run=run).order_by("step").values_list("value", flat=True)) == [2.5, 2.0]
    assert Rollout.objects.get(run=run).components == {"exact": 1.0}
    assert Checkpoint.objects.get(run=run).path == out(run, "checkpoint-2")
    assert LogLine.objects.filter(run=run, line="step 2").exists()


def test_a_log_line_past_the_cap_is_stored_cut_with_a_marker_and_the_batch_lands(live_run):
    # Only the body was capped (2.5 MiB): one 2 MB line was one 2 MB row, read back whole in every page.
    run, token = live_run
    r = send(run.pk, token, batch(run, logs=["short", "x" * (LOG_LINE_CHARS + 5)]))
    assert r.status_code == 200
    lines = list(LogLine.objects.filter(run=run).order_by("id").values_list("line", flat=True))
    assert lines[0] == "short"
    assert lines[1] == "x" * LOG_LINE_CHARS + " … [cut by the Studio: 5 more characters]"
    assert MetricPoint.objects.filter(run=run).count() == 2  # the rest of the batch landed


def test_completed_from_a_run_whose_running_report_was_lost_still_completes(live_run):
    run, token = live_run
    r = send(run.pk, token, batch(run, status="completed"))
    assert r.status_code == 200
    run.refresh_from_db()
    assert run.status == Status.COMPLETED and run.started_at is not None


def test_a_replayed_batch_is_counted_once(live_run):
    run, token = live_run
    send(run.pk, token, batch(run))
    r = send(run.pk, token, batch(run))
    assert r.status_code == 200 and r.json()["duplicate"] is True
    assert MetricPoint.objects.filter(run=run).count() == 2
    assert Rollout.objects.filter(run=run).count() == 1 and Checkpoint.objects.filter(run=run).count() == 1


def test_another_runs_token_gets_403_and_writes_nothing(api, live_run):
    run, _ = live_run
    other_id = api.post("/api/training-runs", sft_body()).json()["id"]
    other_token = crypto.new_token("ing")
    TrainingRun.objects.filter(pk=other_id).update(status=Status.PROVISIONING, attempt=1, ingest_token_hash=crypto.hash_token(other_token))
    assert send(run.pk, other_token, batch(run)).status_code == 403
    assert not MetricPoint.objects.filter(run=run).exists()
    assert TrainingRun.objects.get(pk=run.pk).status == Status.PROVISIONING


def test_an_old_attempts_token_gets_403(live_run):
    run, old = live_run
    TrainingRun.objects.filter(pk=run.pk).update(attempt=2, ingest_token_hash=crypto.hash_token("ing_new"))
    assert send(run.pk, old, batch(run)).status_code == 403
    assert not MetricPoint.objects.filter(run=run).exists()


def test_a_restart_ends_the_failed_attempts_token_before_the_new_attempt_is_dispatched(api, live_run):
    """START of a failed run wipes its series and queues it; until a worker dispatches the new
    attempt (and issues its token), the old attempt's engine must not write into the wiped run."""
    run, old = live_run
    send(run.pk, old, {"batch_id": "a", "status": "running"})
    send(run.pk, old, {"batch_id": "b", "status": "failed", "error": {"code": "training_error", "message": "boom"}})
    assert api.post(f"/api/training-runs/{run.pk}/start").status_code == 202  # on_commit never fires here
    assert TrainingRun.objects.get(pk=run.pk).status == Status.QUEUED
    assert send(run.pk, old, batch(run, batch_id="late")).status_code == 403
    run.refresh_from_db()
    assert run.status == Status.QUEUED and run.stage == "" and run.progress == {}
    assert not MetricPoint.objects.filter(run=run).exists() and not Rollout.objects.filter(run=run).exists()


def test_a_user_api_token_is_not_an_ingest_token(live_run, tokens):
    run, _ = live_run
    assert send(run.pk, tokens["owner"], batch(run)).status_code == 403


def test_no_token_gets_401(live_run):
    run, _ = live_run
    assert send(run.pk, None, batch(run)).status_code == 401


def test_reported_failure_keeps_its_code_and_log_tail(live_run):
    run, token = live_run
    send(run.pk, token, {"batch_id": "a", "status": "running"})
    send(run.pk, token, {"batch_id": "b", "status": "failed", "error": {"code": "oom", "message": "CUDA out of memory", "log_tail": ["x"] * 300}})
    run.refresh_from_db()
    assert run.status == Status.FAILED and run.error["code"] == "oom" and len(run.error["log_tail"]) == 200


def test_an_unknown_error_code_becomes_training_error(live_run):
    run, token = live_run
    send(run.pk, token, {"batch_id": "a", "status": "failed", "error": {"code": "segfault", "message": "boom"}})
    assert TrainingRun.objects.get(pk=run.pk).error["code"] == "training_error"


def test_completed_after_stop_does_not_resurrect_the_run(live_run):
    run, token = live_run
    send(run.pk, token, {"batch_id": "a", "status": "running"})
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.CANCELLED)
    r = send(run.pk, token, {"batch_id": "b", "status": "completed", "logs": ["flushed at stop"]})
    assert r.status_code == 200
    assert TrainingRun.objects.get(pk=run.pk).status == Status.CANCELLED
    assert LogLine.objects.filter(run=run, line="flushed at stop").exists()


def ended(run, status: str, seconds_ago: float) -> None:
    from datetime import timedelta

    from django.utils import timezone

    TrainingRun.objects.filter(pk=run.pk).update(status=status, finished_at=timezone.now() - timedelta(seconds=seconds_ago), stage="train",
                                                 progress={"step": 5, "max_steps": 10})


def test_a_stopped_run_takes_its_engines_last_flush_but_no_end_of_training_artifacts(live_run):
    # A token kept after STOP published a "final" model for a cancelled run and rewrote its stage and progress.
    run, token = live_run
    ended(run, Status.CANCELLED, 3)
    late = batch(run, status=None, stage="merge", progress={"step": 99},
                 checkpoints=[{"step": 4, "path": out(run, "checkpoint-4"), "kind": "checkpoint"}, {"step": 9, "path": out(run, "final"), "kind": "final"}])
    assert send(run.pk, token, late).status_code == 200
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.stage == "train" and run.progress == {"step": 5, "max_steps": 10}
    assert list(Checkpoint.objects.filter(run=run).values_list("kind", flat=True)) == ["checkpoint"]  # saved before the stop: resumable
    assert MetricPoint.objects.filter(run=run).count() == 2 and LogLine.objects.filter(run=run, line="step 2").exists()
    assert LogLine.objects.filter(run=run, line__contains="the final checkpoint (step 9) reported after the run was cancelled is not recorded").exists()


def test_a_stopped_runs_progress_reaches_the_steps_its_engine_trained_before_the_sigterm_landed(live_run):
    # STOP at step 5; the engine trained on to step 7 before its SIGTERM landed, and its last flush
    # stored those steps' metrics: the progress said 5 of 10 while the charts and log went to 7.
    run, token = live_run
    ended(run, Status.CANCELLED, 3)
    trained = [{"step": s, "key": "loss", "value": 1.0} for s in (6, 7)]
    assert send(run.pk, token, batch(run, batch_id="late", status=None, metrics=trained, progress={"step": 7, "max_steps": 10, "eta_s": 3})).status_code == 200
    run.refresh_from_db()
    assert run.progress == {"step": 7, "max_steps": 10}  # the step alone: no ETA for a run that ended
    # Never past what it trained, nor its max_steps, nor back.
    assert send(run.pk, token, batch(run, batch_id="past", status=None, metrics=[{"step": 8, "key": "loss", "value": 1.0}],
                                     progress={"step": 12, "max_steps": 10})).status_code == 200
    assert send(run.pk, token, batch(run, batch_id="back", status=None, metrics=[], progress={"step": 6, "max_steps": 10})).status_code == 200
    run.refresh_from_db()
    assert run.progress == {"step": 8, "max_steps": 10} and run.status == Status.CANCELLED


@pytest.mark.parametrize("status", [Status.CANCELLED, Status.COMPLETED, Status.FAILED])
def test_reports_a_minute_after_the_run_ended_are_a_409_and_store_nothing(live_run, status):
    run, token = live_run
    ended(run, status, 61)
    r = send(run.pk, token, batch(run, status=None))
    assert r.status_code == 409 and r.json()["errors"][0]["field"] == "status" and "reports are closed" in r.json()["detail"]
    assert ("START the run again" in r.json()["errors"][0]["message"]) is (status != Status.COMPLETED)  # a completed run cannot start again
    assert not MetricPoint.objects.filter(run=run).exists() and not Checkpoint.objects.filter(run=run).exists()
    assert not LogLine.objects.filter(run=run, line="step 1").exists()


def test_progress_holds_numbers_only(live_run):
    run, token = live_run
    r = send(run.pk, token, batch(run, progress={"step": "x", "max_steps": {"a": 1}}))
    assert r.status_code == 400 and {e["field"] for e in r.json()["errors"]} >= {"progress.step"}
    assert TrainingRun.objects.get(pk=run.pk).progress == {}


def test_a_malformed_batch_is_a_400_naming_the_field(live_run):
    run, token = live_run
    r = send(run.pk, token, {"batch_id": "a", "metrics": [{"step": "x", "key": "loss", "value": 1}]})
    assert r.status_code == 400
    assert r.json()["errors"][0]["field"] == "metrics[0].step"
    assert not MetricPoint.objects.filter(run=run).exists()


def test_the_system_prompt_an_engine_reports_is_kept_on_its_attempt_and_a_batch_without_one_keeps_it(transactional_db, live_server, live_run):
    from training.engine.reporter import Reporter

    run, token = live_run
    RunAttempt.objects.create(run=run, attempt=1, config=run.config)
    reporter = Reporter(f"{live_server.url}/api/ingest/runs/{run.pk}", token, flush_interval=0.05, echo=False).start()
    reporter.system_prompt("Solve it step by step, then write #### and the answer.")
    assert reporter.close(timeout=10)
    assert RunAttempt.objects.get(run=run, attempt=1).system_prompt == "Solve it step by step, then write #### and the answer."
    # An engine from before the field (or a batch without it) changes nothing; "" says it used none.
    assert send(run.pk, token, batch(run)).status_code == 200
    assert RunAttempt.objects.get(run=run, attempt=1).system_prompt == "Solve it step by step, then write #### and the answer."
    assert send(run.pk, token, {"batch_id": "b2", "system_prompt": ""}).status_code == 200
    assert RunAttempt.objects.get(run=run, attempt=1).system_prompt == ""


def test_a_completion_with_a_nul_does_not_cost_the_batch_its_metrics(transactional_db, live_server, live_run):
    # The engine's reporter against the real ingest: a 400 for one NUL in a generated completion
    # dropped the whole batch (that step's metrics, logs, progress and checkpoint).
    from training.engine.reporter import Reporter

    run, token = live_run
    reporter = Reporter(f"{live_server.url}/api/ingest/runs/{run.pk}", token, flush_interval=0.05, echo=False).start()
    reporter.rollout({"step": 3, "prompt": "1+1=", "completion": "2\x00\ud800", "reward": 0.5, "advantage": None, "components": {}})
    reporter.metric(3, "loss", 0.25)
    reporter.checkpoint(3, out(run, "adapter"), "adapter")
    assert reporter.close(timeout=10)
    assert list(Rollout.objects.filter(run=run).values_list("completion", flat=True)) == ["2\ufffd?"]
    assert MetricPoint.objects.filter(run=run, step=3, key="loss").exists()
    assert Checkpoint.objects.filter(run=run, step=3, kind="adapter").exists()


def test_non_finite_numbers_from_the_engine_do_not_cost_the_batch(transactional_db, live_server, live_run):
    # A diverged loss, a reward function that divides by zero, an ETA of inf: JSON and the ingest
    # refuse NaN and Infinity, so the reporter must not send them, and the rest of the batch lands.
    from training.engine.reporter import Reporter

    run, token = live_run
    reporter = Reporter(f"{live_server.url}/api/ingest/runs/{run.pk}", token, flush_interval=0.05, echo=False).start()
    reporter.metric(4, "loss", float("nan"))
    reporter.metric(5, "loss", float("inf"))
    reporter.metric(4, "grad_norm", 1.5)
    reporter.rollout({"step": 4, "prompt": "1/0=", "completion": "?", "reward": float("nan"), "advantage": None, "components": {}})
    reporter.rollout({"step": 4, "prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": float("nan"), "components": {"ratio": float("inf")}})
    reporter.progress({"step": 4, "max_steps": 10, "eta_s": float("inf")})
    reporter.checkpoint(4, out(run, "checkpoint-4"), "checkpoint")
    assert reporter.close(timeout=10)
    assert list(MetricPoint.objects.filter(run=run).values_list("key", "value")) == [("grad_norm", 1.5)]
    assert list(Rollout.objects.filter(run=run).values_list("completion", "reward", "advantage", "components")) == [("2", 1.0, None, {"ratio": None})]
    run.refresh_from_db()
    assert run.progress == {"step": 4, "max_steps": 10, "eta_s": None}
    assert Checkpoint.objects.filter(run=run, step=4).exists()
    # Said once in the run's log, where the user looks when a chart stops.
    lines = list(LogLine.objects.filter(run=run).values_list("line", flat=True))
    assert sum("loss is nan" in line or "loss is inf" in line for line in lines) == 1
    assert any("a rollout's reward is nan" in line for line in lines)


def test_a_checkpoint_ingest_refuses_costs_the_batch_nothing_else(transactional_db, live_server, live_run):
    # The real ingest answers 400 for a checkpoint outside the attempt's output folder and stores
    # nothing of its batch; the engine's reporter sends the rest again without it.
    from training.engine.reporter import Reporter

    run, token = live_run
    reporter = Reporter(f"{live_server.url}/api/ingest/runs/{run.pk}", token, flush_interval=0.05, echo=False)
    reporter.status("running")
    reporter.metric(2, "loss", 0.5)
    reporter.checkpoint(2, out(run, "checkpoint-2"), "checkpoint")
    reporter.checkpoint(2, "/etc", "checkpoint")
    reporter.log("last line", echo=False)
    assert reporter.start().close(timeout=10)
    assert list(Checkpoint.objects.filter(run=run).values_list("path", flat=True)) == [out(run, "checkpoint-2")]
    assert MetricPoint.objects.filter(run=run, step=2, key="loss").exists()
    assert LogLine.objects.filter(run=run, line="last line").exists()
    assert TrainingRun.objects.get(pk=run.pk).status == Status.RUNNING
    assert any("checkpoints[1].path" in line for line in reporter.log_tail)


def test_a_backlog_over_the_request_limit_arrives_whole_and_in_order(transactional_db, live_server, live_run, settings):
    # What an engine buffers while the Studio is down for a while: more than one request may carry.
    # Sent whole it was a 500, retried forever, and no later batch (nor heartbeat) got through.
    from training.engine.reporter import Reporter

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 50_000  # the reporter keeps under 2 MB; a Studio set lower answers 413
    run, token = live_run
    reporter = Reporter(f"{live_server.url}/api/ingest/runs/{run.pk}", token, flush_interval=0.05, echo=False)
    reporter.status("running")
    for step in range(3000):
        reporter.metric(step, "loss", 1.0 / (step + 1))
        reporter.log(f"step {step}: {'x' * 60}", echo=False)
    assert reporter.start().close(timeout=60)
    assert MetricPoint.objects.filter(run=run, key="loss").count() == 3000
    lines = list(LogLine.objects.filter(run=run, line__startswith="step ").order_by("id").values_list("line", flat=True))
    assert lines == [f"step {step}: {'x' * 60}" for step in range(3000)]
    assert TrainingRun.objects.get(pk=run.pk).status == Status.RUNNING


# ---- what a checkpoint report may say ------------------------------------------------------------
# The Studio commits, merges and resumes from the folders an engine reports, and an engine runs code
# its project controls. The engine saves under its spec's output_dir (checkpoint-<step>, final,
# adapter, merged); on the local backend that is the attempt's own output folder on this machine.


def no_trace_of(run, batch_id: str) -> bool:
    return not (MetricPoint.objects.filter(run=run).exists() or LogLine.objects.filter(run=run).exists()
                or Rollout.objects.filter(run=run).exists() or Checkpoint.objects.filter(run=run).exists()
                or run.ingest_batches.filter(batch_id=batch_id).exists())


@pytest.mark.parametrize("where", ["/etc/passwd", "../../../../etc", "dotdot", "another attempt", "another run", "link", "the output folder"])
def test_a_checkpoint_outside_the_attempts_output_folder_is_a_400_and_nothing_of_the_batch_is_stored(api, live_run, settings, tmp_path, where):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run, token = live_run
    own = output_dir(run.pk, 1)
    own.mkdir(parents=True)
    path = {"dotdot": f"{own}/../../../../etc", "another attempt": str(output_dir(run.pk, 2) / "checkpoint-1"),
            "another run": str(output_dir(run.pk + 1, 1) / "checkpoint-1"), "link": str(own / "checkpoint-1"),
            "the output folder": str(own)}.get(where, where)
    if where == "link":
        (own / "checkpoint-1").symlink_to("/etc")
    body = batch(run, checkpoints=[{"step": 1, "path": str(own / "checkpoint-1") if where != "link" else str(own / "checkpoint-0")},
                                   {"step": 2, "path": path, "kind": "merged" if where == "../../../../etc" else "checkpoint"}])
    r = send(run.pk, token, body)
    assert r.status_code == 400, r.content
    assert r.json()["errors"][0]["field"] == "checkpoints[1].path"
    assert "output folder" in r.json()["errors"][0]["message"] or "absolute path" in r.json()["errors"][0]["message"]
    assert no_trace_of(run, body["batch_id"])
    assert TrainingRun.objects.get(pk=run.pk).status == Status.PROVISIONING  # its "running" was not applied either


def test_a_remote_engines_checkpoint_path_must_be_an_absolute_path_without_dotdot(live_run):
    # A dstack or Modal machine's folders cannot be looked at from here: only their shape is checked.
    run, token = live_run
    TrainingRun.objects.filter(pk=run.pk).update(compute={"backend": "dstack", "accelerators": "A100:1"})
    for i, path in enumerate(["../../../../etc", "/tmp/studio-output/../../etc", "checkpoint-1"]):
        r = send(run.pk, token, {"batch_id": f"bad{i}", "checkpoints": [{"step": 1, "path": path}]})
        assert r.status_code == 400 and r.json()["errors"][0]["field"] == "checkpoints[0].path", r.content
    assert send(run.pk, token, {"batch_id": "ok", "checkpoints": [{"step": 1, "path": "/tmp/studio-output/checkpoint-1"}]}).status_code == 200
    assert list(Checkpoint.objects.filter(run=run).values_list("path", flat=True)) == ["/tmp/studio-output/checkpoint-1"]


def test_a_merged_model_mid_run_is_a_400_naming_the_kind(live_run):
    # The engine reports "merged" only at the end of a LoRA run, after that step's adapter.
    run, token = live_run
    body = batch(run, checkpoints=[{"step": 1, "path": out(run, "merged"), "kind": "merged"}])
    r = send(run.pk, token, body)
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "checkpoints[0].kind", r.content
    assert "adapter" in r.json()["errors"][0]["message"]
    assert no_trace_of(run, body["batch_id"])


def test_the_end_of_a_lora_run_reports_its_adapter_then_its_merged_model(live_run):
    run, token = live_run
    assert send(run.pk, token, {"batch_id": "a", "checkpoints": [{"step": 9, "path": out(run, "adapter"), "kind": "adapter"}]}).status_code == 200
    assert send(run.pk, token, {"batch_id": "m", "checkpoints": [{"step": 9, "path": out(run, "merged"), "kind": "merged"}]}).status_code == 200
    both = [{"step": 10, "path": out(run, "adapter"), "kind": "adapter"}, {"step": 10, "path": out(run, "merged"), "kind": "merged"}]
    assert send(run.pk, token, {"batch_id": "am", "checkpoints": both}).status_code == 200
    assert list(Checkpoint.objects.filter(run=run).order_by("id").values_list("step", "kind")) == [(9, "adapter"), (9, "merged"), (10, "adapter"), (10, "merged")]


def test_a_batch_resent_after_the_reports_closed_is_still_a_duplicate_not_a_409(live_run):
    # Its first answer was lost near the end of the run: the engine's reporter reads a 409 as
    # "superseded", so the retry must get the duplicate answer, and store nothing twice.
    run, token = live_run
    assert send(run.pk, token, batch(run, batch_id="q1", status=None)).status_code == 200
    ended(run, Status.COMPLETED, 61)
    r = send(run.pk, token, batch(run, batch_id="q1", status=None))
    assert r.status_code == 200 and r.json() == {"ok": True, "duplicate": True}
    assert MetricPoint.objects.filter(run=run).count() == 2 and Checkpoint.objects.filter(run=run).count() == 1
    assert LogLine.objects.filter(run=run, line="step 1").count() == 1
    r = send(run.pk, token, batch(run, batch_id="q2", status=None))  # a batch never applied is still refused
    assert r.status_code == 409 and MetricPoint.objects.filter(run=run).count() == 2


# ---- numbers are numbers ---------------------------------------------------------------------------
# Strict, as a step is: pydantic's lax mode stored a metric "5" as 5.0 and true as 1.0.


@pytest.mark.parametrize("value", ["5", True, "nan", [1]])
@pytest.mark.parametrize("where, field", [
    ("metric", "metrics[0].value"), ("reward", "rollouts[0].reward"), ("advantage", "rollouts[0].advantage"), ("progress", "progress.step"),
])
def test_a_number_sent_as_a_string_or_a_boolean_is_a_400_naming_the_field(live_run, value, where, field):
    run, token = live_run
    body = batch(run)
    if where == "metric":
        body["metrics"] = [{"step": 1, "key": "loss", "value": value}]
    elif where == "progress":
        body["progress"] = {"step": value, "max_steps": 10}
    else:
        body["rollouts"] = [{**body["rollouts"][0], where: value}]
    r = send(run.pk, token, body)
    assert r.status_code == 400, r.content
    assert [e["field"] for e in r.json()["errors"]] == [field]
    assert "number" in r.json()["errors"][0]["message"]
    assert no_trace_of(run, body["batch_id"])
    assert TrainingRun.objects.get(pk=run.pk).progress == {}


def test_integers_are_numbers_and_keep_their_type_in_progress(live_run):
    run, token = live_run
    body = batch(run, metrics=[{"step": 1, "key": "loss", "value": 5}], progress={"step": 5, "max_steps": 10, "eta_s": 1.5, "mfu": None},
                 rollouts=[{"step": 1, "prompt": "p", "completion": "c", "reward": 1, "advantage": 0}])
    assert send(run.pk, token, body).status_code == 200
    assert MetricPoint.objects.get(run=run).value == 5.0
    assert list(Rollout.objects.filter(run=run).values_list("reward", "advantage")) == [(1.0, 0.0)]
    assert TrainingRun.objects.get(pk=run.pk).progress == {"step": 5, "max_steps": 10, "eta_s": 1.5, "mfu": None}


# ---- a batch that raced a STOP, a restart or a DELETE ----------------------------------------------
# The token is checked before the body is parsed; the write comes after. The tests run what lands in
# between at the last step before the write (refuse_foreign_checkpoints), in that racing order.


def meanwhile(monkeypatch, action) -> None:
    from training import ingest

    checked = ingest.refuse_foreign_checkpoints

    def then_race(run, batch):
        checked(run, batch)
        action()
    monkeypatch.setattr(ingest, "refuse_foreign_checkpoints", then_race)


def test_a_batch_checked_before_stop_and_start_is_refused_after_the_restart(api, monkeypatch, live_run):
    run, old = live_run
    send(run.pk, old, {"batch_id": "a", "status": "running", "metrics": [{"step": 1, "key": "loss", "value": 6.23}]})
    meanwhile(monkeypatch, lambda: (api.post(f"/api/training-runs/{run.pk}/stop"), api.post(f"/api/training-runs/{run.pk}/start")))
    r = send(run.pk, old, batch(run, batch_id="late", status=None, metrics=[{"step": 888, "key": "loss", "value": 8.0}]))
    assert r.status_code == 403
    run.refresh_from_db()
    assert run.status == Status.QUEUED and run.progress == {} and run.stage == ""
    assert not MetricPoint.objects.filter(run=run).exists() and not Checkpoint.objects.filter(run=run).exists()
    assert not IngestBatch.objects.filter(run=run).exists()


def test_a_final_checkpoint_checked_before_stop_is_not_recorded_on_the_cancelled_run(api, monkeypatch, live_run):
    run, token = live_run
    send(run.pk, token, {"batch_id": "a", "status": "running"})
    meanwhile(monkeypatch, lambda: api.post(f"/api/training-runs/{run.pk}/stop"))
    late = batch(run, batch_id="late", status=None, stage="merge", progress={"step": 10, "max_steps": 10},
                 checkpoints=[{"step": 10, "path": out(run, "final"), "kind": "final"}])
    assert send(run.pk, token, late).status_code == 200  # the engine's last flush after a STOP is still taken
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.stage != "merge" and run.progress == {}
    assert not Checkpoint.objects.filter(run=run).exists()
    assert LogLine.objects.filter(run=run, line__contains="the final checkpoint (step 10) reported after the run was cancelled is not recorded").exists()


def test_a_batch_whose_run_was_deleted_meanwhile_is_a_403_not_a_duplicate(monkeypatch, live_run):
    run, token = live_run
    meanwhile(monkeypatch, lambda: TrainingRun.objects.filter(pk=run.pk).delete())
    r = send(run.pk, token, batch(run, batch_id="orphan"))
    assert r.status_code == 403 and "not valid for this run" in r.json()["detail"]
    assert not IngestBatch.objects.filter(run_id=run.pk).exists() and not MetricPoint.objects.filter(run_id=run.pk).exists()


def test_a_checkpoint_reported_again_in_another_batch_is_recorded_once(live_run):
    run, token = live_run
    saved = {"step": 2, "path": out(run, "checkpoint-2"), "kind": "checkpoint"}
    assert send(run.pk, token, {"batch_id": "a", "checkpoints": [saved]}).status_code == 200
    assert send(run.pk, token, {"batch_id": "b", "checkpoints": [saved, {**saved, "step": 4, "path": out(run, "checkpoint-4")}]}).status_code == 200
    assert list(Checkpoint.objects.filter(run=run).values_list("attempt", "step", "kind")) == [(1, 2, "checkpoint"), (1, 4, "checkpoint")]


def test_progress_from_a_batch_that_arrives_late_does_not_go_back(live_run):
    run, token = live_run
    send(run.pk, token, {"batch_id": "newer", "progress": {"step": 8, "max_steps": 10}})
    send(run.pk, token, {"batch_id": "older", "progress": {"step": 6, "max_steps": 10}, "logs": ["step 6"]})
    run.refresh_from_db()
    assert run.progress == {"step": 8, "max_steps": 10} and LogLine.objects.filter(run=run, line="step 6").exists()
