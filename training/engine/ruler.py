"""RULER mode: the built-in ``ruler_task`` environment, scored by an LLM judge.

Prompts come from ``config.ruler_task_args.dataset`` (a ``prompt``, ``question`` or ``text`` column;
Studio stages a Data Hub ref into the spec's ``environment.ruler_dataset``); the task's
``system_prompt`` is the policy's system message and the judge's criteria. Each step's GROUP of
rollouts for one prompt goes to the judge in one request, which scores them relative to each other
(0..1 each, RULER style). The judge is an external OpenAI-compatible endpoint (``config.judge``:
``endpoint``, ``model``); its API key comes from the ``STUDIO_JUDGE_API_KEY`` environment variable
(Studio reads it from the project's secret store at dispatch) — never from the spec, never logged.

Failures (connection errors, non-2xx, replies that are not the JSON scores) are retried with
exponential backoff; after the last attempt the run fails (``training_error``) with the judge's message.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from .environments import Environment
from .spec import DatasetRef, SpecError

API_KEY_ENV = "STUDIO_JUDGE_API_KEY"
ATTEMPTS = int(os.environ.get("STUDIO_JUDGE_ATTEMPTS", "4"))
BACKOFF_S = float(os.environ.get("STUDIO_JUDGE_BACKOFF_SECONDS", "0.5"))
TIMEOUT_S = float(os.environ.get("STUDIO_JUDGE_TIMEOUT_SECONDS", "60"))
PROMPT_COLUMNS = ("prompt", "question", "text")

JUDGE_SYSTEM = (
    "You are a careful judge for reinforcement learning. Several responses were sampled for the same prompt. "
    "Compare them with each other and score EACH response from 0 to 1 by how well it meets the criteria; "
    "better responses get higher scores than worse ones. Reply with JSON only, in this shape: "
    '{"scores": [{"id": 1, "explanation": "<one sentence>", "score": 0.0}, ...]} with one entry per response.'
)


class JudgeError(RuntimeError):
    """The judge failed after every retry; the message is the judge's own."""


def chat_url(endpoint: str) -> str:
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/chat/completions") else f"{endpoint}/chat/completions"


class RulerJudge:
    def __init__(self, endpoint: str, model: str, api_key: str, log: Callable[[str], Any] = print) -> None:
        self.url = chat_url(endpoint)
        self.base = self.url.removesuffix("/chat/completions")
        self.model = model
        self._api_key = api_key
        self.log = log

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[redacted]") if self._api_key else text

    def _post(self, body: dict[str, Any] | None, url: str | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            url or self.url, data=json.dumps(body).encode() if body is not None else None, method="POST" if body is not None else "GET",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._api_key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310 - the user's judge URL
                return json.loads(response.read().decode())
        except urllib.error.HTTPError as exc:
            raw = exc.read().decode(errors="replace")[:2000]
            try:
                err = json.loads(raw).get("error")
                message = err.get("message") if isinstance(err, dict) else (err or raw)
            except (ValueError, AttributeError):
                message = raw
            raise JudgeError(f"HTTP {exc.code}: {message}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise JudgeError(f"{type(exc).__name__}: {reason}") from None

    @staticmethod
    def parse_scores(content: str, n: int) -> list[float]:
        text = content.strip()
        fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
        if fenced:
            text = fenced.group(1)
        start, end = text.find("{"), text.rfind("}")
        try:
            data = json.loads(text[start : end + 1] if start >= 0 else text)
            items = data["scores"] if isinstance(data, dict) else data
            by_id = {int(item["id"]): float(item["score"]) for item in items}
        except (ValueError, KeyError, TypeError) as exc:
            raise JudgeError(f"the judge's reply is not the JSON scores ({exc}): {content[:300]!r}") from None
        missing = [i for i in range(1, n + 1) if i not in by_id]
        if missing:
            raise JudgeError(f"the judge's reply has no score for response{'' if len(missing) == 1 else 's'} {missing}: {content[:300]!r}")
        return [min(1.0, max(0.0, by_id[i])) for i in range(1, n + 1)]

    def _retrying(self, what: str, call: Callable[[], Any]) -> Any:
        last = ""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return call()
            except (JudgeError, KeyError, IndexError, TypeError) as exc:
                last = self._redact(str(exc) if isinstance(exc, JudgeError) else f"unexpected reply shape ({type(exc).__name__}: {exc})")
                if attempt < ATTEMPTS:
                    delay = BACKOFF_S * 2 ** (attempt - 1)
                    self.log(f"ruler: judge {what} attempt {attempt}/{ATTEMPTS} failed ({last}); retrying in {delay:.1f} s")
                    time.sleep(delay)
        raise JudgeError(f"RULER judge {self.model or '(model unset)'} at {self.base} failed after {ATTEMPTS} attempts: {last}")

    def served_model(self) -> str:
        def ask() -> str:
            models = self._post(None, f"{self.base}/models")["data"]
            if not models:
                raise JudgeError(f"{self.base}/models lists no model: set config.judge.model")
            return str(models[0]["id"])

        return self._retrying("/models", ask)

    def score_group(self, criteria: str, prompt: str, responses: list[str]) -> list[float]:
        listing = "\n".join(f'<response id="{i}">\n{r}\n</response>' for i, r in enumerate(responses, 1))
        user = f"Criteria (the task's system prompt):\n{criteria}\n\nPrompt:\n{prompt}\n\nResponses ({len(responses)}):\n{listing}"
        body = {"model": self.model, "temperature": 0, "messages": [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]}

        def ask() -> list[float]:
            reply = self._post(body)
            return self.parse_scores(reply["choices"][0]["message"]["content"] or "", len(responses))

        return self._retrying("scoring", ask)


class RulerEnvironment(Environment):
    id = "builtin/ruler_task"

    def __init__(self, rows: list[dict[str, Any]], system_prompt: str, judge: RulerJudge) -> None:
        self.rows = rows
        self.system_prompt = system_prompt
        self.judge = judge

    @classmethod
    def from_spec(cls, spec: Any, block: dict[str, Any], log: Callable[[str], Any] = print) -> RulerEnvironment:
        from .data import load_rows

        task = spec.cfg("ruler_task_args") or {}
        judge = spec.cfg("judge") or {}
        if not task.get("dataset"):
            raise SpecError("config.ruler_task_args.dataset: RULER mode needs a dataset of prompts")
        if not task.get("system_prompt"):
            raise SpecError("config.ruler_task_args.system_prompt: RULER mode needs the judge's criteria")
        mode = judge.get("mode", "external")
        if mode != "external":
            raise SpecError(f'config.judge.mode: {mode!r} judges are not available in this engine; use "external"')
        if not judge.get("endpoint"):
            raise SpecError("config.judge.endpoint: an external judge needs the URL of an OpenAI-compatible endpoint")
        api_key = os.environ.get(API_KEY_ENV, "")
        if not api_key:
            raise SpecError(f"config.judge.api_key_secret: the judge's API key did not reach the engine ({API_KEY_ENV} is unset)")
        staged = block.get("ruler_dataset") or {"path": task["dataset"]}
        data = load_rows([DatasetRef(str(staged["path"]), None, staged.get("revision"), staged.get("data_hub") is True)])
        column = next((c for c in PROMPT_COLUMNS if c in data.column_names), None)
        if column is None:
            raise SpecError(f"config.ruler_task_args.dataset: rows need a prompt (or question/text) column; got {sorted(data.column_names)}")
        rows = [{"prompt": str(r[column])} for r in data if r[column]]
        if not rows:
            raise SpecError("config.ruler_task_args.dataset: the dataset has no prompts")
        client = RulerJudge(str(judge["endpoint"]), str(judge.get("model") or ""), api_key, log)
        if not client.model:
            client.model = client.served_model()  # before the policy loads: a dead judge fails the run early
            log(f"ruler: config.judge.model is unset; using {client.model!r}, the first model {client.base}/models lists")
        return cls(rows, str(task["system_prompt"]), client)

    def prompts(self, n: int, seed: int) -> list[dict[str, Any]]:
        import random

        rng = random.Random(seed)
        out: list[dict[str, Any]] = []
        while len(out) < n:
            batch = list(self.rows)
            rng.shuffle(batch)
            out += batch
        return [dict(r) for r in out[:n]]

    def score(self, row: dict[str, Any], completion: str) -> dict[str, float]:
        return self.score_group([row], [completion])[0]

    def score_group(self, rows: list[dict[str, Any]], completions: list[str]) -> list[dict[str, float]]:
        # One judge call per run of consecutive rollouts of the same prompt (a GRPO step is one group).
        out: list[dict[str, float]] = []
        start = 0
        while start < len(rows):
            end = start + 1
            while end < len(rows) and rows[end]["prompt"] == rows[start]["prompt"]:
                end += 1
            scores = self.judge.score_group(self.system_prompt, str(rows[start]["prompt"]), completions[start:end])
            out += [{"judge": s, "total": s} for s in scores]
            start = end
        return out
