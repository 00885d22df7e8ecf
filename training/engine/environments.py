"""Environment mode for GRPO: an environment supplies prompt rows and scores completions.

`score` returns a dict of reward components plus ``total``; only ``total`` drives the advantage, the
components are reported with each rollout so a user can see *why* a completion scored what it did.
Environments are looked up by id (``builtin/arith@main``; the ``@ref`` names a version and is ignored by
built-ins). Anything else is a package (packages.py): Studio stages it and names it in the spec's
``environment`` block (``path`` on the local backend; ``repo`` + ``commit`` fetched through the Data Hub's
HF API elsewhere; a catalogue package's ``files`` inline); the catalogue's ``builtin/<name>`` packages
also resolve from the engine's repo checkout. RULER mode
(``rl_mode: "ruler"``) is the built-in ``ruler_task`` environment in ruler.py.
"""

from __future__ import annotations

import contextlib
import io
import math
import numbers
import os
import random
import re
import signal
import statistics
import sys
import threading
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .spec import SpecError


def group_std(rewards: Sequence[float]) -> float:
    """The spread of one prompt's rollout rewards as TRL's ``reward_std`` metric and its advantages take it:
    the sample standard deviation (n − 1). The engine's reported advantages and the Rollouts tab use this."""
    return statistics.stdev(rewards) if len(rewards) > 1 else 0.0


# How long one call into a package's code (load_environment, prompts(), one score(), one call_tool())
# may take: generous, since a reward may call a judge or run tests, but a hung call must not hold the run
# and the local backend's CPU slot for ever. Past it the run fails naming the call (seeds 000/002 set no limit).
CALL_LIMIT_S = 300.0
# A call that has not returned this long after CALL_LIMIT_S ignored the alarm (C code that retries through
# the signal, a bare `except:` that swallowed it): the watchdog thread then fails the run and ends the process.
STUCK_GRACE_S = 30.0
# What a package prints goes to the run log (engine.log keeps all of it); per step, at most this much is
# sent to the Studio, so a print in score() cannot flood ingest with tens of thousands of lines.
OUTPUT_LINES_PER_STEP = 200
OUTPUT_CHARS_PER_STEP = 20_000
FLOAT32_MAX = 3.4028234663852886e38  # a reward TRL stores as float32 must fit in one


class CallTimeout(BaseException):
    """A package call ran past CALL_LIMIT_S. A BaseException, so a reward's own `except Exception` does not swallow it."""


class BadReward(ValueError):
    """score() returned something that is not a finite real number; the message says which component."""


def reward_value(component: str, value: Any) -> float:
    """`value` as the float TRL trains on: a real number (int, float, bool, a numpy scalar) that is finite
    and fits in float32. A string such as "0.5" is refused rather than parsed: it is a bug in the reward."""
    numpy = sys.modules.get("numpy")
    if isinstance(value, numbers.Real) or (numpy is not None and isinstance(value, numpy.bool_)):
        number = float(value)
        if math.isfinite(number) and abs(number) <= FLOAT32_MAX:
            return number
        return _bad(f'component "{component}" is {value!r}: a reward must be a finite number within ±3.4e38')
    return _bad(f'component "{component}" is {type(value).__name__} {str(value)[:40]!r}: a reward must be a number (int, float or bool)')


def _bad(message: str) -> float:
    raise BadReward(message)


def checked_scores(parts: Any) -> dict[str, float]:
    """A package's score() result, every component checked by `reward_value`; ``total`` is required."""
    if not isinstance(parts, dict):
        raise BadReward(f"{type(parts).__name__} {str(parts)[:40]!r}: score() must return a dict of components or a number")
    if "total" not in parts:
        raise BadReward(f"no \"total\" among its components {', '.join(map(str, parts))}")
    return {str(k): reward_value(str(k), v) for k, v in parts.items()}


def _raise_timeout(signum: int, frame: Any) -> None:
    raise CallTimeout


@contextlib.contextmanager
def time_limit(seconds: float, on_stuck: Callable[[], None] | None = None) -> Iterator[None]:
    """Raise `CallTimeout` in the block after `seconds`: SIGALRM, so only on the main thread, and it takes
    effect as soon as the interpreter gets control back (Python code, sleeps, I/O and lock waits, which
    the signal interrupts). If the block is still running `STUCK_GRACE_S` later (C code that retries
    through the signal, or a call off the main thread), `on_stuck` runs on a watchdog thread. C code
    that holds the GIL stops every thread, the reporter's heartbeats too: the Studio's heartbeat timeout
    fails that run."""
    alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    previous: Any = None
    if alarm:
        previous = signal.signal(signal.SIGALRM, _raise_timeout)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    watchdog = threading.Timer(seconds + STUCK_GRACE_S, on_stuck) if on_stuck is not None else None
    if watchdog is not None:
        watchdog.daemon = True
        watchdog.start()
    try:
        yield
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        if watchdog is not None:
            watchdog.cancel()


class _RunLogOutput(io.TextIOBase):
    """sys.stdout / sys.stderr while package code runs: every write goes on to the real stream (the
    engine.log), and each whole line to the run log, up to the per-step limits (Environment._forward;
    its _end_output says how many lines were cut)."""

    def __init__(self, stream: Any, env: Environment) -> None:
        self.stream = stream
        self.env = env

    def write(self, text: str) -> int:
        self.stream.write(text)
        env = self.env
        env._output_partial += text
        *lines, env._output_partial = env._output_partial.split("\n")
        for line in lines:
            env._forward(line)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return int(self.stream.fileno())

    def isatty(self) -> bool:
        return bool(self.stream.isatty())

    @property
    def encoding(self) -> Any:  # type: ignore[override]
        return self.stream.encoding

    def __getattr__(self, name: str) -> Any:  # buffer, errors, ...: the real stream's
        return getattr(self.stream, name)


class PackageError(RuntimeError):
    """An environment package failed; the message is a whole sentence naming the environment (the cause is chained)."""


class PackageCallError(PackageError):
    """A package callback (score, a reward function, a tool, prompts) raised during the run."""


def _package_place(exc: BaseException, root: Path, what: str = "") -> str:
    """Where in the package `exc` was raised, for a failure's sentence: " in f() at path:line" from the
    innermost traceback frame inside the package (its path relative to the root), without the function
    where it is the module or `what`, the callback the sentence already names; "" outside the package."""
    root = root.resolve()
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            rel = Path(frame.filename).resolve().relative_to(root)
        except (ValueError, OSError):
            continue
        found = (rel.as_posix(), frame.lineno or 0, frame.name)
    if found is None:
        return ""
    path, line, func = found
    inside = "" if f"{func}()" == what or func == "<module>" else f" in {func}()"
    return f"{inside} at {path}:{line}"


class Environment(ABC):
    id: str = ""
    # Set for a loaded package (packages.load_package): where its files lie, so a failure inside it is
    # named by package-relative file:line rather than by the staged copy in the run directory.
    package_dir: Path | None = None
    # The id as failures name it: the pinned commit instead of the branch when the spec says which.
    ref: str = ""
    # The columns score() reads from a row, beyond "prompt": a run's own dataset must have them
    # (a package declares them as ROW_KEYS in its __init__.py; Studio checks them before START too).
    row_keys: tuple[str, ...] = ()
    # The package's CONFIG merged with the run's overrides: set by packages.load, absent on the built-ins.
    config: dict[str, Any]
    # Set by environment_for for a run: the run log, where what the package prints goes too, and what
    # fails the run from the watchdog thread when a call ignores its time limit (see time_limit).
    run_log: Callable[..., None] | None = None
    on_stuck: Callable[[str], None] | None = None
    _output_step = 0
    _output_lines = 0
    _output_chars = 0
    _output_cut = 0
    _output_partial = ""

    @abstractmethod
    def prompts(self, n: int, seed: int) -> list[dict[str, Any]]:
        """Rows with at least a ``prompt`` string; other keys are passed back to `score`."""

    @abstractmethod
    def score(self, row: dict[str, Any], completion: str) -> dict[str, float]:
        """Reward components for one completion, including ``total``."""

    def score_group(self, rows: list[dict[str, Any]], completions: list[str]) -> list[dict[str, float]]:
        """Scores for one step's rollouts; judges that compare a group override this."""
        return [self.score(row, completion) for row, completion in zip(rows, completions, strict=True)]

    def score_rollouts(self, rows: list[dict[str, Any]], completions: list[str], step: int, row_numbers: Sequence[int],
                       numbered: str = "row") -> list[dict[str, float]]:
        """One step's scores. A package's score() is called once per rollout, each call guarded, so a
        failure, a hang or a reward that is not a finite number names its step, row and rollout; a
        package's own score_group (a judge comparing the group) and the built-ins score the group at once.
        `numbered` is what `row_numbers` count: "row" for a dataset's rows, "prompt" for the prompts the
        environment's own prompts() gave (they cycle its data, so the number is no row of it)."""
        if self.package_dir is None:
            return self.score_group(rows, completions)
        self._output_step = step  # what it printed since the last step's scores (a tool call's, say) counts here too
        try:
            if type(self).score_group is not Environment.score_group:
                return self.guarded("score_group()", lambda: [checked_scores(s) for s in self.score_group(rows, completions)], where=f"step {step}")
            return [
                self.guarded("score()", lambda row=row, completion=completion: checked_scores(self.score(row, completion)),
                             where=f"step {step}, {numbered} {row_numbers[i]}, rollout {i + 1} of {len(rows)}")
                for i, (row, completion) in enumerate(zip(rows, completions, strict=True))
            ]
        finally:
            self._end_output()

    def own_prompts(self, n: int, seed: int) -> list[dict[str, Any]]:
        """The environment's own prompts, taken once before step 1 as the last part of loading it: what
        prompts() prints counts as load-time output (step 0), as what the package printed at import
        did, and leaves step 1 its own limits for what score() prints."""
        self._output_step = 0
        try:
            return self.guarded("prompts()", self.prompts, n, seed)
        finally:
            self._end_output()

    def guarded(self, what: str, fn: Any, *args: Any, where: str = "") -> Any:
        """Call `fn` (one of the package's callbacks, named `what`, e.g. "score()"; `where` is the step,
        row and rollout it scores) within CALL_LIMIT_S, with what it prints going to the run log too; a
        failure in a package's code, a hang, a bad reward or a sys.exit becomes a `PackageCallError`
        naming the environment, the callback, `where` and the file:line in the package, so the run's
        error says where to look without reading the log."""
        if self.package_dir is None:  # a built-in: its errors are the engine's own
            return fn(*args)
        name = self.ref or self.id
        at_where = f" ({where})" if where else ""
        stuck = None
        if self.on_stuck is not None:
            report = self.on_stuck
            stuck = lambda: report(f"environment {name}: {what}{at_where} did not return within {CALL_LIMIT_S:g} s "  # noqa: E731
                                   "and ignored the time limit, so the run was stopped; fix the package and start the run again")
        try:
            with time_limit(CALL_LIMIT_S, stuck), self._output_to_run_log():
                return fn(*args)
        except (PackageError, SpecError):
            raise
        except CallTimeout:
            raise PackageCallError(f"environment {name}: {what}{at_where} did not return within {CALL_LIMIT_S:g} s; "
                                   "fix the package (a hung call, or one that waits on something that never answers) and start the run again") from None
        except BadReward as exc:
            raise PackageCallError(f"environment {name}: {what}{at_where} returned {exc}; fix the package and start the run again") from None
        except (Exception, SystemExit) as exc:  # sys.exit() in a reward is a failure of the package, not a way out of the engine
            at = _package_place(exc, self.package_dir, what)
            raise PackageCallError(f"environment {name}: {what} raised {type(exc).__name__}: {exc}{at}{at_where}; "
                                   "fix the package and start the run again") from exc

    # ---- what the package prints -----------------------------------------------------------------
    @contextlib.contextmanager
    def _output_to_run_log(self) -> Iterator[None]:
        if self.run_log is None or isinstance(sys.stdout, _RunLogOutput):
            yield
            return
        with contextlib.redirect_stdout(_RunLogOutput(sys.stdout, self)), contextlib.redirect_stderr(_RunLogOutput(sys.stderr, self)):
            yield

    def _forward(self, line: str) -> None:
        if self.run_log is None:
            return
        if self._output_lines < OUTPUT_LINES_PER_STEP and self._output_chars + len(line) <= OUTPUT_CHARS_PER_STEP:
            self._output_lines += 1
            self._output_chars += len(line)
            self.run_log(line, echo=False)  # the real stream already has it
        else:
            self._output_cut += 1

    def _end_output(self) -> None:
        if self._output_partial:
            line, self._output_partial = self._output_partial, ""
            self._forward(line)
        if self._output_cut and self.run_log is not None:
            self.run_log(f"environment {self.ref or self.id}: {self._output_cut} more lines it printed at step {self._output_step} were not sent "
                         f"(at most {OUTPUT_LINES_PER_STEP} lines and {OUTPUT_CHARS_PER_STEP:,} characters a step; engine.log has them all)")
        self._output_lines, self._output_chars, self._output_cut = 0, 0, 0


class _Loading(Environment):
    """Stands in for a package while environment_for loads it: what the package prints at import and in
    load_environment() goes to the run log, within the per-step limits, counted as step 0."""

    def __init__(self, environment_id: str, ref: str, run_log: Callable[..., None]) -> None:
        self.id, self.ref, self.run_log = environment_id, ref, run_log

    def prompts(self, n: int, seed: int) -> list[dict[str, Any]]:
        raise NotImplementedError

    def score(self, row: dict[str, Any], completion: str) -> dict[str, float]:
        raise NotImplementedError


class ArithEnvironment(Environment):
    """Two-number addition with a dense reward, so even a tiny random model climbs it.

    Components: ``format`` = share of the first characters that are digits; ``digits`` = share of the
    answer's digits right in place; ``exact`` = 1 when the first word is exactly the answer.
    """

    id = "builtin/arith"
    _pattern = re.compile(r"(\d+)\s*\+\s*(\d+)")

    def __init__(self, max_operand: int = 9, log: Callable[[str], None] = print) -> None:
        self.max_operand = max_operand
        self.log = log  # the run log (environment_for passes the reporter's)
        self._warned = False

    def prompts(self, n: int, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        rows = []
        for _ in range(n):
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            rows.append({"prompt": f"What is {a}+{b}? Answer with digits only.", "answer": str(a + b)})
        return rows

    def answer_for(self, row: dict[str, Any]) -> str | None:
        """The row's ``answer``, else the sum of the first ``a+b`` in its prompt; None when it has neither."""
        if row.get("answer") not in (None, ""):
            return str(row["answer"])
        match = self._pattern.search(str(row.get("prompt", "")))
        return str(int(match.group(1)) + int(match.group(2))) if match else None

    def score(self, row: dict[str, Any], completion: str) -> dict[str, float]:
        answer = self.answer_for(row)
        if answer is None:
            # A run's own dataset may mix such rows in (ROW_KEYS cannot say "answer, or a+b in the prompt",
            # so START lets them through): they score 0 rather than failing the run mid-way, said once.
            if not self._warned:
                self._warned = True
                self.log(f'builtin/arith: the row with prompt {str(row.get("prompt"))[:80]!r} has no "answer" and no a+b in its prompt, '
                         'so its rollouts score 0 (later such rows too, without another warning): give those rows an "answer" column')
            return {"format": 0.0, "digits": 0.0, "exact": 0.0, "total": 0.0}
        text = completion.strip()
        head = text[: max(len(answer), 4)]
        fmt = sum(ch.isdigit() for ch in head) / len(head) if head else 0.0
        digits = sum(1 for i, ch in enumerate(answer) if i < len(text) and text[i] == ch) / len(answer)
        words = text.split()
        exact = 1.0 if words and words[0].rstrip(".") == answer else 0.0
        total = 0.4 * fmt + 0.4 * digits + 0.2 * exact
        return {"format": fmt, "digits": digits, "exact": exact, "total": total}


_REGISTRY: dict[str, type[Environment]] = {ArithEnvironment.id: ArithEnvironment}


def register(env_cls: type[Environment]) -> type[Environment]:
    _REGISTRY[env_cls.id] = env_cls
    return env_cls


def load_environment(environment_id: str) -> Environment:
    name = environment_id.split("@", 1)[0]
    if name not in _REGISTRY:
        raise SpecError(f"config.environment_id: unknown environment {environment_id!r}; built-in ones are {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]()


# ---- environments named by the run spec ----------------------------------------------------------

ENGINE_REPO = Path(__file__).resolve().parents[2]
CATALOGUE_DIR = ENGINE_REPO / "environments" / "catalogue"


def _staged_directory(spec: Any, block: dict[str, Any], environment_id: str) -> Path:
    """Where the environment package lies: the staged path, a catalogue package, or a Data Hub fetch."""
    from .packages import EnvironmentLoadError

    path = block.get("path")
    if path and Path(path).exists():
        return Path(path)
    name = environment_id.split("@", 1)[0]
    if isinstance(block.get("files"), dict) and block["files"]:
        dest = Path(spec.output_dir) / "environment"
        for rel, text in block["files"].items():
            target = (dest / rel).resolve()
            if not target.is_relative_to(dest.resolve()):
                raise EnvironmentLoadError(f"environment {environment_id}: file path {rel!r} leaves the package")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        return dest
    if name.startswith("builtin/"):
        candidate = CATALOGUE_DIR / (block.get("package") or name.split("/", 1)[1].replace("-", "_"))
        if candidate.is_dir():
            return candidate
        raise EnvironmentLoadError(f"config.environment_id: unknown environment {environment_id!r}; built-in ones are "
                                   f"{', '.join(sorted(_REGISTRY) + sorted('builtin/' + p.name.replace('_', '-') for p in CATALOGUE_DIR.glob('*/__init__.py')))}")
    if block.get("repo") and block.get("commit"):
        return _fetch_from_hub(spec, block)
    raise EnvironmentLoadError(f"environment {environment_id}: the package was not staged (no path, repo or commit in the spec's environment block)")


def _fetch_from_hub(spec: Any, block: dict[str, Any]) -> Path:
    """Remote backends: download the pinned commit through the Data Hub's HF-compatible API."""
    from huggingface_hub import snapshot_download

    dest = Path(spec.output_dir) / "environment"
    endpoint = block.get("hub_url") or os.environ.get("HF_ENDPOINT")
    snapshot_download(repo_id=block["repo"], revision=block["commit"], local_dir=str(dest), endpoint=endpoint, token=os.environ.get("HF_TOKEN"))
    return dest


def environment_for(spec: Any, reporter: Any = None) -> Environment:
    """The run's environment, loaded BEFORE the model so a bad package fails the run before step one."""
    from .packages import EnvironmentLoadError, load_package, package_root

    block = spec.raw.get("environment") or {}
    if spec.cfg("rl_mode", "environment") == "ruler":
        from .ruler import RulerEnvironment

        return RulerEnvironment.from_spec(spec, block, reporter.log if reporter is not None else print)
    environment_id = str(spec.cfg("environment_id", "builtin/arith@main"))
    name = environment_id.split("@", 1)[0]
    if name in _REGISTRY:
        env = _REGISTRY[name]()
        if reporter is not None and isinstance(env, ArithEnvironment):
            env.log = reporter.log
        return env
    directory = _staged_directory(spec, block, environment_id)
    if reporter is not None:
        where = f"{block.get('repo')}@{str(block.get('commit'))[:12]}" if block.get("commit") else str(directory)
        reporter.log(f"environment {environment_id}: loading the package staged from {where}")
    ref = f"{name}@{str(block['commit'])[:12]}" if block.get("commit") else ""
    shown = ref or environment_id  # failures name the pinned commit, as Environment.guarded's do
    on_stuck = _stop_run(spec, reporter) if reporter is not None else None
    loading = _Loading(environment_id, ref, reporter.log) if reporter is not None else None
    stuck = None
    if on_stuck is not None:
        stuck = lambda: on_stuck(f"environment {shown}: loading the package did not finish within {CALL_LIMIT_S:g} s "  # noqa: E731
                                 "and ignored the time limit, so the run was stopped; fix the package and start the run again")
    try:
        with time_limit(CALL_LIMIT_S, stuck), loading._output_to_run_log() if loading is not None else contextlib.nullcontext():
            env = load_package(directory, environment_id)
        env.ref = ref
        if reporter is not None:
            env.run_log, env.on_stuck = reporter.log, on_stuck
        return env
    except EnvironmentLoadError:
        raise
    except CallTimeout:
        raise EnvironmentLoadError(f"environment {shown}: loading the package did not finish within {CALL_LIMIT_S:g} s; "
                                   "fix the package and start the run again") from None
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        at = _package_place(exc, package_root(directory))
        raise EnvironmentLoadError(f"environment {shown}: loading the package failed: {type(exc).__name__}: {exc}{at}; "
                                   "fix the package and start the run again") from exc
    finally:
        if loading is not None:
            loading._end_output()


def _stop_run(spec: Any, reporter: Any) -> Callable[[str], None]:
    """What the watchdog thread does when a package call ignores its time limit: the main thread is
    stuck in it and cannot unwind, so this thread reports the failure (as the engine's error contract
    would) and ends the process."""
    from .__main__ import close_reporter, final_drain_seconds  # now, not on the watchdog thread

    def stop(message: str) -> None:
        try:
            reporter.log(message)
            reporter.status("failed", {"code": "training_error", "message": message, "log_tail": list(reporter.log_tail)})
            close_reporter(reporter, spec, final_drain_seconds(spec))
        finally:
            sys.stdout.flush()
            os._exit(1)

    return stop
