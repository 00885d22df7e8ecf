from __future__ import annotations

import json
import time

from training.engine import reporter as reporter_module
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
    assert set(body) == {"batch_id", "metrics", "logs", "rollouts", "checkpoints", "stage", "status", "error", "progress", "system_prompt"}
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


def test_a_run_that_ended_a_while_ago_stops_the_reporter_like_a_superseded_attempt(ingest: IngestStub) -> None:
    ingest.always = 409  # Studio closes an attempt's reports a minute after its run ended
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05).start()
    rep.log("still training")
    assert _wait(rep.superseded.is_set)
    rep.log("after")
    time.sleep(0.3)
    rep.close(timeout=1)
    assert len(ingest.attempts) == 1


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


def test_stages_reported_before_a_batch_goes_out_all_arrive_in_order(ingest: IngestStub) -> None:
    # The engine's setup can take less than one flush: "setup" and then "train" are both reported
    # before the first batch is taken. The later stage must not replace the earlier one.
    ingest.responses = [503]
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05).start()
    rep.log("loading")
    assert _wait(lambda: len(ingest.attempts) >= 1)  # the first batch is being retried
    rep.stage("setup")
    rep.status("running")
    rep.stage("train")
    rep.metric(1, "loss", 1.0)
    rep.stage("train")  # the same stage again seals nothing
    assert rep.close(timeout=15)
    assert ingest.scalars("stage") == ["setup", "train"]
    assert ingest.scalars("status") == ["running"]
    stages = [line for line in ingest.collect("logs") if line.startswith("stage:")]
    assert stages == ["stage: setup", "stage: train", "stage: train"]


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


def backlog(rep: Reporter, lines: int) -> None:
    """What an engine buffers while Studio is unreachable: logs, metrics, a checkpoint, then its end."""
    rep.status("running")
    for i in range(lines):
        rep.log(f"step {i}: " + "x" * 40, echo=False)
        rep.metric(i, "loss", 1.0 / (i + 1))
    rep.checkpoint(lines, "/tmp/ckpt", "checkpoint")
    rep.status("completed")


def test_a_batch_too_large_for_studio_arrives_in_ordered_parts(ingest: IngestStub) -> None:
    # Studio answers 413 to a body over its limit. Dropping the batch lost a backlog; resending it whole
    # would be refused forever while the heartbeat starves. It goes as smaller batches, in order.
    ingest.max_body = 20_000
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05, echo=False)
    backlog(rep, 2000)  # ≈ 200 kB, buffered before the sender starts
    assert rep.start().close(timeout=30)
    assert 413 in [a["status"] for a in ingest.attempts]
    assert all(a["size"] <= 20_000 for a in ingest.attempts if a["status"] == 200)
    assert ingest.collect("logs") == [f"step {i}: " + "x" * 40 for i in range(2000)] + ["saved checkpoint at step 2000: /tmp/ckpt"]
    assert [m["step"] for m in ingest.collect("metrics")] == list(range(2000))
    assert ingest.scalars("status") == ["running", "completed"]
    # Each part keeps its place: the checkpoint after every metric, "completed" after all of it.
    batches = ingest.batches
    where = {key: max(i for i, b in enumerate(batches) if b[key]) for key in ("metrics", "logs", "checkpoints")}
    ended = next(i for i, b in enumerate(batches) if b["status"] == "completed")
    assert where["metrics"] <= where["checkpoints"] < ended and where["logs"] < ended == len(batches) - 1


def test_a_batch_over_the_default_limit_is_split_before_it_is_sent(ingest: IngestStub, monkeypatch) -> None:
    monkeypatch.setattr(reporter_module, "MAX_BATCH_BYTES", 10_000)
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05, echo=False)
    backlog(rep, 500)
    assert rep.start().close(timeout=30)
    assert [a["status"] for a in ingest.attempts if a["status"] != 200] == []  # no round trip wasted on a 413
    assert max(a["size"] for a in ingest.attempts) <= 10_000 and len(ingest.batches) > 3
    assert len(ingest.collect("logs")) == 501 and ingest.scalars("status") == ["running", "completed"]


def test_a_lone_item_larger_than_studio_takes_is_dropped_and_the_rest_arrives(ingest: IngestStub, capsys) -> None:
    ingest.max_body = 20_000
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05, echo=False)
    rep.status("running")
    rep.log("before", echo=False)
    rep.rollout({"step": 1, "prompt": "p", "completion": "y" * 50_000, "reward": 1.0})
    rep.log("after", echo=False)
    rep.status("completed")
    assert rep.start().close(timeout=30)
    assert ingest.collect("logs") == ["before", "after"] and ingest.collect("rollouts") == []
    assert ingest.scalars("status") == ["running", "completed"]
    assert "one of rollouts is" in capsys.readouterr().err


def refuse_etc(body):  # type: ignore[no-untyped-def]
    """Studio's answer to a checkpoint outside the output folder: a 400 naming the item."""
    bad = [i for i, c in enumerate(body["checkpoints"]) if c["path"] == "/etc"]
    if not bad:
        return None
    return 400, {"detail": "This batch reports a checkpoint this attempt's engine cannot have saved: nothing of the batch was stored.",
                 "errors": [{"field": f"checkpoints[{i}].path", "message": "/etc is not inside this attempt's output folder"} for i in bad]}


def test_a_refused_item_is_dropped_and_the_rest_of_its_batch_arrives(ingest: IngestStub, capsys) -> None:
    # Studio stores nothing of a batch it answers 400. Dropping the whole batch lost the metrics and
    # the final status that came with one bad checkpoint path.
    ingest.answer = refuse_etc
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05, echo=False)
    rep.status("running")
    for step in range(1, 9):
        rep.metric(step, "loss", 1.0 / step)
    rep.checkpoint(4, "/tmp/out/checkpoint-4", "checkpoint")
    rep.checkpoint(8, "/etc", "checkpoint")
    rep.log("done", echo=False)
    rep.status("completed")
    assert rep.start().close(timeout=30)
    assert [m["step"] for m in ingest.collect("metrics")] == list(range(1, 9))
    assert ingest.collect("checkpoints") == [{"step": 4, "path": "/tmp/out/checkpoint-4", "kind": "checkpoint"}]
    assert "done" in ingest.collect("logs") and ingest.scalars("status") == ["running", "completed"]
    assert sum(a["status"] == 400 for a in ingest.attempts) == 1  # the rest went at once, not by halving
    assert "checkpoints[1].path: /etc is not inside" in capsys.readouterr().err


def test_a_refusal_that_names_no_item_drops_its_batch_once(ingest: IngestStub, capsys) -> None:
    # Django's host check answers an HTML 400 to every request: there is nothing to take out.
    ingest.answer = lambda body: 400 if body["logs"] else None
    rep = Reporter(ingest.url, TOKEN, flush_interval=0.05, echo=False)
    for i in range(50):
        rep.log(f"line {i}", echo=False)
    rep.status("bogus")
    assert rep.start().close(timeout=10)
    assert sum(a["status"] == 400 for a in ingest.attempts) == 1
    assert "dropping the batch" in capsys.readouterr().err
