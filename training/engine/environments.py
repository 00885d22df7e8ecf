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

import os
import random
import re
import statistics
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .spec import SpecError


def group_std(rewards: Sequence[float]) -> float:
    """The spread of one prompt's rollout rewards as TRL's ``reward_std`` metric and its advantages take it:
    the sample standard deviation (n − 1). The engine's reported advantages and the Rollouts tab use this."""
    return statistics.stdev(rewards) if len(rewards) > 1 else 0.0


class PackageError(RuntimeError):
    """An environment package failed; the message is a whole sentence naming the environment (the cause is chained)."""


class PackageCallError(PackageError):
    """A package callback (score, a reward function, a tool, prompts) raised during the run."""


def _package_frame(exc: BaseException, root: Path) -> tuple[str, int, str] | None:
    """The innermost traceback frame inside the package: (path relative to its root, line, function)."""
    root = root.resolve()
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            rel = Path(frame.filename).resolve().relative_to(root)
        except (ValueError, OSError):
            continue
        found = (rel.as_posix(), frame.lineno or 0, frame.name)
    return found


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

    @abstractmethod
    def prompts(self, n: int, seed: int) -> list[dict[str, Any]]:
        """Rows with at least a ``prompt`` string; other keys are passed back to `score`."""

    @abstractmethod
    def score(self, row: dict[str, Any], completion: str) -> dict[str, float]:
        """Reward components for one completion, including ``total``."""

    def score_group(self, rows: list[dict[str, Any]], completions: list[str]) -> list[dict[str, float]]:
        """Scores for one step's rollouts; judges that compare a group override this."""
        return [self.score(row, completion) for row, completion in zip(rows, completions, strict=True)]

    def guarded(self, what: str, fn: Any, *args: Any) -> Any:
        """Call `fn` (one of the package's callbacks, named `what`, e.g. "score()"); a failure in a
        package's code becomes a `PackageCallError` naming the environment, the callback and the file:line
        in the package, so the run's error says where to look without reading the log."""
        if self.package_dir is None:  # a built-in: its errors are the engine's own
            return fn(*args)
        try:
            return fn(*args)
        except (PackageError, SpecError):
            raise
        except Exception as exc:
            where = _package_frame(exc, self.package_dir)
            at = ""
            if where is not None:
                path, line, func = where
                inside = "" if f"{func}()" == what or func == "<module>" else f" in {func}()"
                at = f"{inside} at {path}:{line}"
            raise PackageCallError(f"environment {self.ref or self.id}: {what} raised {type(exc).__name__}: {exc}{at}; "
                                   "fix the package and start the run again") from exc


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
    from .packages import EnvironmentLoadError, load_package

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
    try:
        env = load_package(directory, environment_id)
        if block.get("commit"):
            env.ref = f"{name}@{str(block['commit'])[:12]}"
        return env
    except EnvironmentLoadError:
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise EnvironmentLoadError(f"environment {environment_id}: loading the package failed: {type(exc).__name__}: {exc}") from exc
