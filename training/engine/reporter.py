"""Buffers what the engine has to say and POSTs it to Studio's ingest endpoint in batches.

Stdlib only (urllib), so it works in any container. One background thread owns the network: it sends
whatever is buffered every ``flush_interval`` seconds, and an empty batch at least every
``heartbeat_interval`` seconds so a long optimizer step still counts as alive. A batch that fails with a
connection error or a 5xx is resent with the *same* batch_id (the server dedups), with exponential backoff.
A 401/403 means this attempt was superseded, a 409 that its run ended a while ago: the reporter stops
and the engine must exit.
A batch too large for one request (a backlog left by an outage, a burst of long rollouts) goes as
smaller batches, in order: resending it whole would be refused forever and starve the heartbeat. A
batch Studio refuses (another 4xx: it stores nothing of it) goes again without the items Studio's
findings name, which are dropped with its reason; one whose refusal names no item is dropped.
Batches still undelivered when `close` gives up (a Studio outage longer than the final drain) are
kept, in order and with their batch ids, for the engine to write to its spool file (`write_spool`):
the Studio delivers them from there when it sees the job end, and dedups them like any resend.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 200
BACKOFF_CAP_S = 10.0
# Under Studio's default request limit (Django's DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MiB); a Studio set
# lower answers 413, which splits the batch just the same.
MAX_BATCH_BYTES = 2_000_000
ITEM_KEYS = ("metrics", "logs", "rollouts", "checkpoints")
# In the engine's output_dir: the batches the Studio did not take before the engine exited, one JSON
# body a line, exactly as they would have been POSTed (the Studio's local backend delivers them).
SPOOL_NAME = "undelivered-reports.jsonl"
# The engine's exit code when it trained to the end but spooled reports (its end status among them).
UNDELIVERED_EXIT = 4


def storable(value: Any) -> Any:
    """Text the model or a log produced, made storable: a NUL becomes U+FFFD and an unpaired surrogate
    "?"; a float that is NaN or infinite (a reward component, an ETA) becomes null. Studio refuses all
    three with a 400 (PostgreSQL and JSON cannot store them), and a 400 drops the whole batch: one
    completion of a tiny or broken model would take that second's metrics, logs and checkpoints."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value


def split_batch(batch: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Two batches that say what `batch` says, in its order: the first half of its items, then the
    rest with its stage, status, error and progress (a status goes after the metrics it ends). Each
    gets its own batch_id: nothing of `batch` was stored. None for a lone item with nothing else, or
    for a batch with no items (halving it would send it again as it is)."""
    items = [(key, item) for key in ITEM_KEYS for item in batch[key]]
    rest = {key: batch[key] for key in batch if key not in ITEM_KEYS and key != "batch_id"}
    if not items or (len(items) == 1 and all(value is None for value in rest.values())):
        return None
    cut = (len(items) + 1) // 2
    first: dict[str, Any] = {key: [] for key in ITEM_KEYS} | {key: None for key in rest}
    second: dict[str, Any] = {key: [] for key in ITEM_KEYS} | rest
    for i, (key, item) in enumerate(items):
        (first if i < cut else second)[key].append(item)
    first["batch_id"], second["batch_id"] = uuid.uuid4().hex, uuid.uuid4().hex
    return first, second


ITEM_FIELD = re.compile(r"^(metrics|logs|rollouts|checkpoints)\[(\d+)\]")


@dataclass
class Refused:
    """Studio's 4xx for a batch (it stored nothing of it): its reason, and the items its findings name
    by key and index, empty when a finding names something other than an item."""

    reason: str
    items: dict[str, set[int]]


def refused(exc: urllib.error.HTTPError) -> Refused:
    try:
        body = json.loads(exc.read())
        findings = [f for f in body.get("errors") or [] if isinstance(f, dict)]
        detail = str(body.get("detail") or "no reason given")
    except (ValueError, AttributeError, OSError):  # not Studio's JSON: a proxy's or the host check's page
        return Refused("no reason given", {})
    items: dict[str, set[int]] = {}
    for finding in findings:
        named = ITEM_FIELD.match(str(finding.get("field")))
        if named is None:
            return Refused(detail, {})
        items.setdefault(named[1], set()).add(int(named[2]))
    fields = "; ".join(f"{f.get('field')}: {f.get('message')}" for f in findings)
    return Refused(detail + (f" ({fields})" if fields else ""), items)


def without(batch: dict[str, Any], items: dict[str, set[int]]) -> dict[str, Any] | None:
    """`batch` less `items`, as a new batch (nothing of `batch` was stored); None when none of them is in it."""
    kept = {key: [item for i, item in enumerate(batch[key]) if i not in items.get(key, ())] for key in ITEM_KEYS}
    if sum(map(len, kept.values())) == sum(len(batch[key]) for key in ITEM_KEYS):
        return None
    return batch | kept | {"batch_id": uuid.uuid4().hex}


def says_something(batch: dict[str, Any]) -> bool:
    """Whether `batch` is more than a heartbeat: a spooled heartbeat would tell the Studio nothing."""
    return any(batch[key] for key in ITEM_KEYS) or any(value is not None for key, value in batch.items() if key not in ITEM_KEYS and key != "batch_id")


def write_spool(path: Path, batches: list[dict[str, Any]]) -> None:
    """Append `batches` to the spool file at `path`, one JSON body a line, in order. Appended, not
    replaced: a SIGTERM during the final drain closes the reporter a second time, and what the first
    close wrote must stay (a batch written twice is applied once: the Studio dedups on batch_id)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # the reports may quote the data
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        for batch in batches:
            f.write(json.dumps(batch) + "\n")
        f.flush()
        os.fsync(f.fileno())


class Superseded(RuntimeError):
    """The ingest endpoint refused this attempt's token (401/403)."""


class Reporter:
    def __init__(
        self,
        url: str | None,
        token: str | None,
        *,
        heartbeat_interval: float = 10.0,
        flush_interval: float = 1.0,
        request_timeout: float = 10.0,
        echo: bool = True,
    ) -> None:
        self.url = url
        self.token = token or ""
        self.heartbeat_interval = heartbeat_interval
        self.flush_interval = flush_interval
        self.request_timeout = request_timeout
        self.echo = echo
        self.superseded = threading.Event()
        self.log_tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.sent_batches = 0
        self._lock = threading.Condition()
        self._pending = self._empty()
        self._sealed: collections.deque[dict[str, Any]] = collections.deque()  # batches to send before _pending
        self._dirty = False
        self._in_flight = False
        self._stop = threading.Event()
        self._drain_deadline: float | None = None
        self._last_post = 0.0
        self._gave_up = False
        self._undelivered: list[dict[str, Any]] = []  # given up on at shutdown, in order, for the spool
        self._warned: set[str] = set()
        self._thread: threading.Thread | None = None

    # ---- producer side (any thread) -------------------------------------------------------------
    @staticmethod
    def _empty() -> dict[str, Any]:
        return {"metrics": [], "logs": [], "rollouts": [], "checkpoints": [], "stage": None, "status": None, "error": None, "progress": None,
                "system_prompt": None}

    def _add(self, key: str, value: Any) -> None:
        with self._lock:
            if isinstance(self._pending[key], list):
                self._pending[key].append(value)
            else:
                self._pending[key] = value
            self._dirty = True

    def log(self, line: str, *, echo: bool = True) -> None:
        for part in storable(str(line)).splitlines() or [""]:
            self.log_tail.append(part)
            if self.echo and echo:
                print(part, flush=True)
            self._add("logs", part)

    def metric(self, step: int, key: str, value: float) -> None:
        value = float(value)
        if not math.isfinite(value):  # a diverged loss, a NaN reward: said once, never charted
            self._warn_once(key, f"step {step}: {key} is {value}; its non-finite values are not charted")
            return
        self._add("metrics", {"step": int(step), "key": key, "value": value})

    def rollout(self, row: dict[str, Any]) -> None:
        reward = row.get("reward")
        if isinstance(reward, float) and not math.isfinite(reward):
            self._warn_once("rollout reward", f"step {row.get('step')}: a rollout's reward is {reward}; rollouts without a finite reward are not sent")
            return
        self._add("rollouts", storable(row))

    def _warn_once(self, what: str, line: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            self.log(line)

    def checkpoint(self, step: int, path: str, kind: str) -> None:
        self._add("checkpoints", {"step": int(step), "path": str(path), "kind": kind})
        self.log(f"saved {kind} at step {step}: {path}")

    def stage(self, stage: str) -> None:
        with self._lock:
            self._set_in_order("stage", stage)
        self.log(f"stage: {stage}")

    def status(self, status: str, error: dict[str, Any] | None = None) -> None:
        with self._lock:
            self._set_in_order("status", status)
            if error is not None:
                self._pending["error"] = storable(error)  # its message may quote what failed
            self._lock.notify_all()  # a status goes out at once

    def _set_in_order(self, key: str, value: str) -> None:
        """Set the pending batch's status or stage (hold the lock). A batch carries one of each: seal the
        one holding an earlier value so both are sent, in order, instead of "completed" overwriting a
        "running" (or "train" a "setup") that has not gone out yet."""
        if self._pending[key] not in (None, value):
            self._sealed.append(self._pending)
            self._pending = self._empty()
        self._pending[key] = value
        self._dirty = True

    def progress(self, progress: dict[str, Any]) -> None:
        self._add("progress", storable(progress))

    def system_prompt(self, text: str | None) -> None:
        """The system prompt this attempt puts before each prompt ("" for none), wherever it came from."""
        self._add("system_prompt", storable(text or ""))

    # ---- sender side -------------------------------------------------------------------------------
    def start(self) -> Reporter:
        if self.url and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="studio-reporter", daemon=True)
            self._thread.start()
        return self

    def _take(self) -> dict[str, Any]:
        if self._sealed:
            batch = self._sealed.popleft()
        else:
            batch = self._pending
            self._pending = self._empty()
            self._dirty = False
        batch["batch_id"] = uuid.uuid4().hex
        return batch

    def _run(self) -> None:
        while not self.superseded.is_set():
            with self._lock:
                self._lock.wait(timeout=self.flush_interval)
                heartbeat_due = time.monotonic() - self._last_post >= self.heartbeat_interval
                if not (self._dirty or heartbeat_due):
                    if self._stop.is_set():
                        return
                    continue
                batch = self._take()
                self._in_flight = True
            try:
                self._send(batch)
            finally:
                with self._lock:
                    self._in_flight = False
                    self._lock.notify_all()
            if self._stop.is_set() and not self._dirty:
                return

    def _send(self, batch: dict[str, Any]) -> None:
        """Send `batch`, as smaller batches in order when it is too large for one request. When Studio
        refuses items of it (a checkpoint outside the output folder, say), the rest goes again
        without them, its status included; a refusal that names no item drops the batch. Once a batch
        was given up on at shutdown, the rest is kept for the spool unsent: sending a later batch
        (its "completed") while an earlier one waits in the spool would deliver them out of order."""
        if self._gave_up:
            self._keep_undelivered(batch)
            return
        body = json.dumps(batch).encode()
        outcome = "too large" if len(body) > MAX_BATCH_BYTES else self._send_with_retry(batch, body)
        if isinstance(outcome, Refused):
            rest = without(batch, outcome.items)
            dropped = "the items it names" if rest is not None else "the batch"
            self._warn(f"reporter: ingest refused batch {batch['batch_id']}: {outcome.reason}; dropping {dropped}")
            if rest is not None:
                self._send(rest)
            return
        if outcome != "too large":
            return
        halves = split_batch(batch)
        if halves is None:
            key = next((key for key in ITEM_KEYS if batch[key]), "its parts")
            self._warn(f"reporter: one of {key} is {len(body)} bytes, more than Studio takes in a request; dropping it")
            return
        for half in halves:
            if self.superseded.is_set() or self._gave_up:
                return
            self._send(half)

    def _send_with_retry(self, batch: dict[str, Any], body: bytes) -> str | Refused:
        delay = 0.5
        while True:
            outcome = self._post(batch, body)
            if isinstance(outcome, Refused) or outcome in ("ok", "superseded", "too large"):
                return outcome
            deadline = self._drain_deadline
            if deadline is not None and time.monotonic() + delay > deadline:
                self._warn(f"reporter: giving up on batch {batch['batch_id']} at shutdown; it goes to the spool file")
                self._gave_up = True
                self._keep_undelivered(batch)
                return "gave up"
            time.sleep(delay)
            delay = min(delay * 2, BACKOFF_CAP_S)

    def _post(self, batch: dict[str, Any], body: bytes) -> str | Refused:
        assert self.url is not None
        req = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.request_timeout) as resp:
                resp.read()
            self._last_post = time.monotonic()
            self.sent_batches += 1
            return "ok"
        except urllib.error.HTTPError as exc:
            self._last_post = time.monotonic()
            if exc.code in (401, 403, 409):  # 409: the run ended a while ago and its reports are closed
                self._warn(f"reporter: ingest answered {exc.code}; this attempt was superseded or its run has ended")
                self.superseded.set()
                return "superseded"
            if exc.code == 413:
                self._warn(f"reporter: batch {batch['batch_id']} ({len(body)} bytes) is too large for Studio; sending it in parts")
                return "too large"
            if exc.code >= 500 or exc.code == 429:
                self._warn(f"reporter: ingest answered {exc.code}; retrying batch {batch['batch_id']}")
                return "retry"
            # Another 4xx will not get better by resending the same body.
            return refused(exc)
        except (urllib.error.URLError, OSError) as exc:
            self._warn(f"reporter: ingest unreachable ({exc}); retrying batch {batch['batch_id']}")
            return "retry"

    def _keep_undelivered(self, batch: dict[str, Any]) -> None:
        if says_something(batch):
            with self._lock:
                self._undelivered.append(batch)

    def _warn(self, line: str) -> None:
        # Straight to stderr: routing reporter trouble through the buffer would feed the failing channel.
        self.log_tail.append(line)
        print(line, file=sys.stderr, flush=True)

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything buffered so far is sent (or ``timeout`` passes). True if drained."""
        if not self.url or self._thread is None:
            with self._lock:
                while self._dirty:
                    self._take()
            return True
        end = time.monotonic() + timeout
        with self._lock:
            self._lock.notify_all()
            while (self._dirty or self._in_flight) and not self.superseded.is_set():
                left = end - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._lock.notify_all()
                self._lock.wait(timeout=min(left, 0.1))
        return not self._dirty and not self._gave_up

    def close(self, timeout: float = 30.0) -> bool:
        """Send what is left and stop the thread; retries give up at the deadline."""
        self._drain_deadline = time.monotonic() + timeout
        drained = self.flush(timeout)
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            # A POST under way at the deadline ends within request_timeout; its batch then goes to the spool.
            self._thread.join(timeout=max(0.0, self._drain_deadline - time.monotonic()) + self.request_timeout + 0.5)
        if not drained and self.url and not self.superseded.is_set():
            with self._lock:
                # What the thread never took (it stopped at the deadline) follows what it gave up on.
                while self._sealed or self._dirty:
                    self._undelivered.append(self._take())
                self._undelivered = [batch for batch in self._undelivered if says_something(batch)]
        return drained and not self._gave_up

    def take_undelivered(self) -> list[dict[str, Any]]:
        """After `close`: the batches the Studio did not take, in order, each as it would have been
        POSTed (its batch_id included); empty when everything was delivered or the attempt was
        superseded (its reports are refused for good). Taken once: a second call returns only what
        a second close added."""
        with self._lock:
            batches, self._undelivered = self._undelivered, []
        return [] if self.superseded.is_set() else batches


class RankReporter(Reporter):
    """The reporter of a data-parallel rank other than 0: rank 0 alone reports the run, so this one
    sends nothing and prints nothing of the run (rank 0 prints the same lines). Its failure is not
    lost: it is printed, prefixed with the rank, and written to `failure_path` for rank 0 to report
    as the run's error (torchrun then stops rank 0 and the job exits non-zero)."""

    def __init__(self, rank: int, failure_path: Path) -> None:
        super().__init__(None, None, echo=False)
        self.rank = rank
        self.failure_path = failure_path

    def status(self, status: str, error: dict[str, Any] | None = None) -> None:
        if status != "failed" or error is None:
            return
        message = f"rank {self.rank}: {error.get('message')}"
        for line in self.failure_lines():
            print(f"[rank {self.rank}] {line}", file=sys.stderr, flush=True)
        print(message, file=sys.stderr, flush=True)
        self.failure_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.failure_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(storable({**error, "message": message, "log_tail": self.failure_lines()})))
        tmp.replace(self.failure_path)

    def failure_lines(self) -> list[str]:
        """The lines this rank logged from its last traceback on (rank 0 already printed the rest)."""
        lines = list(self.log_tail)
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
        return lines[starts[-1]:] if starts else lines[-30:]
