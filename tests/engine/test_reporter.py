from __future__ import annotations

import json
import time

from training.engine.reporter import Reporter

from .conftest import TOKEN, IngestStub


def _wait(cond, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_batch_carries_bearer_token_and_contract_fields(ingest: IngestStub) -> None:
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05).start()
    rep.metric(3, "loss", 2.1)
    rep.log("hello")
    rep.checkpoint(3, "/tmp/x", "checkpoint")
    rep.progress({"step": 3, "max_steps": 10, "tokens_per_s": 1.0, "step_time_s": 0.1, "eta_s": 0.7})
    rep.status("running")
    assert rep.close(timeout=5)
    assert all(a["auth"] == f"Bearer {TOKEN}" for a in ingest.attempts)
    body = ingest.batches[0]
    assert set(body) == {"batch_id", "metrics", "logs", "rollouts", "checkpoints", "stage", "status", "error", "progress"}
    assert len(body["batch_id"]) == 32
    assert ingest.collect("metrics") == [{"step": 3, "key": "loss", "value": 2.1}]
    assert "hello" in ingest.collect("logs")
    assert ingest.collect("checkpoints") == [{"step": 3, "path": "/tmp/x", "kind": "checkpoint"}]
    assert ingest.scalars("status") == ["running"]


def test_server_errors_are_retried_with_the_same_batch_id(ingest: IngestStub) -> None:
    ingest.responses = [500, 503]
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05).start()
    rep.metric(1, "loss", 1.0)
    assert rep.close(timeout=15)
    statuses = [a["status"] for a in ingest.attempts]
    assert statuses[:3] == [500, 503, 200]
    ids = {a["body"]["batch_id"] for a in ingest.attempts[:3]}
    assert len(ids) == 1  # resent, not re-minted: the server can dedup
    assert ingest.collect("metrics") == [{"step": 1, "key": "loss", "value": 1.0}]


def test_forbidden_marks_superseded_and_stops_sending(ingest: IngestStub) -> None:
    ingest.always = 403
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05).start()
    rep.log("first")
    assert _wait(rep.superseded.is_set)
    n = len(ingest.attempts)
    rep.log("after")
    time.sleep(0.3)
    rep.close(timeout=1)
    assert n == 1 and len(ingest.attempts) == 1  # no retry of a 403, nothing after it


def test_statuses_reported_while_a_batch_is_retried_all_arrive_in_order(ingest: IngestStub) -> None:
    # Ingest is slow to come up: "running" and then "completed" are both reported while the first
    # batch is still being retried. One batch carries one status, so the later one must not replace
    # the earlier (Studio ignores "completed" for a run it never saw running).
    ingest.responses = [503, 503]
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05).start()
    rep.log("loading")
    assert _wait(lambda: len(ingest.attempts) >= 1)
    rep.status("running")
    rep.metric(1, "loss", 1.0)
    rep.status("completed")
    assert rep.close(timeout=15)
    assert ingest.scalars("status") == ["running", "completed"]
    assert ingest.collect("metrics") == [{"step": 1, "key": "loss", "value": 1.0}]


def test_heartbeats_flow_without_any_data(ingest: IngestStub) -> None:
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05, heartbeat_interval=0.2).start()
    assert _wait(lambda: len(ingest.attempts) >= 3, timeout=5)
    rep.close(timeout=2)
    empty = ingest.batches[0]
    assert empty["metrics"] == [] and empty["logs"] == [] and empty["status"] is None


def test_batch_survives_an_ingest_restart() -> None:
    stub = IngestStub()
    port, url = stub.port, stub.url
    stub.close()  # Studio is down: nothing listens on the port
    rep = Reporter(url, TOKEN, flush_interval=0.05).start()
    rep.metric(1, "loss", 1.0)
    time.sleep(1.0)  # a few refused attempts
    back = IngestStub(port=port)
    try:
        assert rep.close(timeout=15)
        assert back.collect("metrics") == [{"step": 1, "key": "loss", "value": 1.0}]
    finally:
        back.close()


def test_close_gives_up_at_its_deadline_when_ingest_stays_down() -> None:
    stub = IngestStub()
    url = stub.url
    stub.close()
    rep = Reporter(url, TOKEN, flush_interval=0.05).start()
    rep.metric(1, "loss", 1.0)
    start = time.monotonic()
    assert not rep.close(timeout=1.0)
    assert time.monotonic() - start < 3


def test_text_studio_cannot_store_is_made_storable_so_the_batch_is_not_dropped(ingest: IngestStub) -> None:
    # A tiny model's GRPO completion held a NUL: ingest answered 400 and the reporter dropped the whole
    # batch, with that step's metrics, progress and the adapter checkpoint.
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05).start()
    rep.rollout({"step": 3, "prompt": "p\x00", "completion": "a\x00b\ud800", "reward": 0.5, "components": {"why": "x\x00"}})
    rep.log("step 3: text \x00 here")
    rep.status("failed", {"code": "training_error", "message": "bad \x00", "log_tail": ["t\ud800"]})
    assert rep.close(timeout=5)
    body = json.dumps(ingest.batches)
    assert "\\u0000" not in body and "\\ud800" not in body
    rollout = ingest.collect("rollouts")[0]
    assert rollout["completion"] == "a\ufffdb?" and rollout["prompt"] == "p\ufffd" and rollout["components"] == {"why": "x\ufffd"}
    assert "step 3: text \ufffd here" in ingest.collect("logs")
    assert ingest.scalars("error")[0]["message"] == "bad \ufffd"
