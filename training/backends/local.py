"""The local backend: runs the engine on the Studio's own machine, in its own process group.

The engine gets an environment built from an allow-list (never the Studio's own secrets) and its
spec in a 0600 file. It imports environment packages that any project member can upload, so it runs
in a sandbox (training/backends/sandbox.py, STUDIO_LOCAL_SANDBOX) that hides the Studio's private
files and processes. STOP sends SIGTERM to the group, waits the grace period, then SIGKILLs it; a
group is signalled only while one of its processes names the attempt's folder (names_attempt: the
kernel gives an ended job's number to other processes).
A job first takes its device slots on this machine (local_runner): the GPUs it asked for, or one of
STUDIO_LOCAL_MAX_CPU_JOBS CPU slots; until it has them it is pending, and says why.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from functools import lru_cache
from pathlib import Path, PurePosixPath

from django.conf import settings

from studio.errors import Finding, counted
from training.backends.base import Backend, BackendError, JobSpec, PollResult
from training.backends.local_runner import WAITING_NAME
from training.compute import accelerators_of
from training.engine.launch import engine_argv
from training.engine.reporter import SPOOL_NAME
from training.refs import LocalRead, local_reads, studio_data, studio_data_at, studio_data_problem

ENV_ALLOW_LIST = (
    "PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "LD_LIBRARY_PATH",
    "HF_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM", "PYTORCH_CUDA_ALLOC_CONF",
)
LOG_TAIL_LINES = 200
REPO_ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def local_gpu_count() -> int:
    """GPUs on this machine, without importing torch into the web process."""
    nvidia_smi = shutil.which("nvidia-smi")
    if not nvidia_smi:
        return 0
    try:
        out = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def local_gpu_devices() -> list[str]:
    """The GPUs local jobs share, as CUDA_VISIBLE_DEVICES entries: the Studio's own
    CUDA_VISIBLE_DEVICES when it is set (an operator keeping GPUs for other work), else every GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [device.strip() for device in visible.split(",") if device.strip() and not device.strip().startswith("-")]
    return [str(index) for index in range(local_gpu_count())]


def slots_dir() -> Path:
    """The lock files of the machine's device slots (local_runner): one per GPU, STUDIO_LOCAL_MAX_CPU_JOBS for the CPU."""
    return Path(settings.STUDIO_RUNS_DIR) / ".slots"


def slot_args(compute: dict) -> list[str]:
    """The runner's arguments for the slots a job takes: the GPUs it asked for, exclusively, or a CPU slot."""
    accel = accelerators_of(compute)
    if accel.is_cpu:
        return ["--slots", str(slots_dir()), "--cpu-slots", str(settings.STUDIO_LOCAL_MAX_CPU_JOBS)]
    return ["--slots", str(slots_dir()), "--gpus", str(accel.count), "--devices", ",".join(local_gpu_devices())]


def run_dir(run_id: int, attempt: int) -> Path:
    return Path(settings.STUDIO_RUNS_DIR) / str(run_id) / f"attempt-{attempt}"


def output_dir(run_id: int, attempt: int) -> Path:
    """The attempt's engine output_dir: every folder it saves (checkpoint-<step>, final, adapter,
    merged) lies inside it."""
    return run_dir(run_id, attempt) / "output"


def relocated(run_id: int, attempt: int, path: str) -> Path | None:
    """Where `path`, a folder the engine of attempt `attempt` of run `run_id` reported under its
    output_dir, lies now: its part below `<run>/attempt-<n>/output/`, under the current
    STUDIO_RUNS_DIR. The path was recorded absolute, and a Studio's var/ (or its STUDIO_RUNS_DIR) may
    have been moved or copied since (README: Moving a Studio): the recorded place is then gone or,
    worse, another copy's files. Not checked against the disk (checkpoint_dir does that). None for a
    path that is relative, has a `..` part, or lies in no folder of that attempt's output."""
    parts = PurePosixPath(path).parts
    if not path.startswith("/") or ".." in parts:
        return None
    own = (str(run_id), f"attempt-{attempt}", "output")
    # The last match: the part below it is the engine's folder name, the part above it any runs dir.
    starts = [i for i in range(len(parts) - 3) if parts[i:i + 3] == own]
    return output_dir(run_id, attempt).joinpath(*parts[starts[-1] + 3:]) if starts else None


def shown_path(checkpoint) -> str:
    """A checkpoint's folder as the Checkpoints tab and the API show it: a local one's where it lies
    now (relocated), not where it was recorded before the Studio's var/ moved; a remote engine's path
    on its own machine (no `<run>/attempt-<n>/output` in it) as it reported it. Not checked on disk."""
    where = relocated(checkpoint.run_id, checkpoint.attempt, checkpoint.path)
    return str(where) if where is not None else checkpoint.path


def checkpoint_dir(checkpoint) -> Path | None:
    """The folder of a reported checkpoint when it lies inside its own attempt's output folder on this
    machine (links and .. resolved first), else None; found where that folder is now (relocated), not
    where it was when recorded. An engine can report any path (a remote one reports paths on its own
    machine): Studio reads, merges or resumes only its attempt's own output, never another run's or
    project's files, the attempt folder's spec (it holds the ingest token) or the rest of this
    machine. Ingest refuses such paths too; this also guards rows stored before. Every reader of a
    local checkpoint's folder goes through here."""
    own = output_dir(checkpoint.run_id, checkpoint.attempt).resolve()
    where = relocated(checkpoint.run_id, checkpoint.attempt, checkpoint.path)
    if where is None:
        return None
    try:
        folder = where.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None
    return folder if folder.is_relative_to(own) and folder != own and folder.is_dir() else None


@lru_cache(maxsize=1)
def sandbox_problem() -> str | None:
    """Why engines cannot run in a sandbox on this machine (None: they can), found by building one.
    Asked once per process: the kernel's answer does not change while it runs."""
    try:
        done = subprocess.run([sys.executable, "-m", "training.backends.sandbox", "--probe"], cwd=REPO_ROOT, env=engine_env({}),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    said = [line.removeprefix("sandbox: ") for line in done.stderr.splitlines() if line.startswith("sandbox: ")]
    return said[-1] if said else f"the probe exited {done.returncode}"


def sandbox_warning() -> str | None:
    """What the run log and the worker's log say when engines run without a sandbox; None when they do not."""
    mode = settings.STUDIO_LOCAL_SANDBOX
    problem = "STUDIO_LOCAL_SANDBOX=off" if mode == "off" else sandbox_problem()
    if problem is None:
        return None
    return (f"the engine is not isolated ({problem}): environment code that any project member uploads runs as the "
            "Studio's OS user and can read its files (other runs' tokens, the database, secrets); "
            "allow user namespaces or set STUDIO_LOCAL_SANDBOX=required (README: Security)")


def named_reads(job: JobSpec) -> list[LocalRead]:
    """Each local path of `job` that its run named (training.refs.local_reads), its dataset entries
    not from the Data Hub. Not what the Studio staged (the environment's package, the step a resumed
    run continues from)."""
    datasets = [(f"dataset[{i}]", entry.get("path")) for i, entry in enumerate(job.dataset) if not entry.get("data_hub")]
    return local_reads(job.method, job.base_model, job.config or {}, datasets)


def studio_data_reads(job: JobSpec) -> list[str]:
    """The named reads of `job` that lead into the Studio's own data (training.refs.studio_data), each
    as `field: why`. START refuses such a run; submit refuses a job that has one all the same (a run
    stored before that check, a path that became a link since), sandbox or none."""
    return [f"{read.field}: {problem}" for read in named_reads(job) if (problem := studio_data_problem(read.value, read.instead))]


def sandbox_plan(job: JobSpec, directory: Path) -> dict:
    """What the engine of `job` may see (training/backends/sandbox.py): the Studio's private folders and
    files and its checkout hidden, then the engine's code, its run's folder (read-write) and the local
    paths its spec reads (read-only) bound back; a path that would show a hidden secret, another run's
    spec or the Data Hub's storage is not, nor one the run named inside the Studio's own data (another
    run's output: only a step the Studio resumes from is shown)."""
    places = studio_data()
    runs, var = Path(settings.STUDIO_RUNS_DIR).resolve(), Path(settings.VAR_DIR).resolve()
    hub = [place.path for place in places if place.folder and place.path != runs]  # the Data Hub's storage, uploads, checkouts
    files = [place.path for place in places if not place.folder]
    hidden = [runs, var, *hub, REPO_ROOT]  # the checkout too: a studio.env beside the code
    own = directory.parent.resolve()  # the run's folder: its attempts, staged environment, cache
    # The engine's code and the catalogue's packages, and the virtualenv when it lies in the checkout.
    code = [REPO_ROOT / "training", REPO_ROOT / "environments", *([Path(sys.prefix)] if Path(sys.prefix).is_relative_to(REPO_ROOT) else [])]

    def may_show(path: Path) -> bool:
        if any(secret.is_relative_to(path) for secret in [*files, *hidden]) or any(path.is_relative_to(h) for h in hub):
            return False
        parts = path.relative_to(runs).parts if path.is_relative_to(runs) else None
        # Another run's folder only below an attempt's output (the step it resumes from): never a spec.
        return parts is None or path.is_relative_to(own) or (len(parts) > 3 and parts[1].startswith("attempt-") and parts[2] == "output")

    environment = job.environment or {}
    staged = [environment.get("path"), (environment.get("ruler_dataset") or {}).get("path"), job.resume_from]
    paths = [Path(p).resolve() for p in staged if isinstance(p, str) and p.startswith("/")]
    paths += [Path(read.value).resolve() for read in named_reads(job) if read.value.startswith("/") and studio_data_at(Path(read.value), places) is None]
    return {"hide": [str(p) for p in hidden], "hide_files": [str(p) for p in files], "read_write": [str(own)],
            "read_only": [*map(str, code), *(str(p) for p in paths if may_show(p))], "cwd": str(REPO_ROOT),
            "pid_file": str(directory / "engine.pid")}


def engine_env(extra: dict[str, str]) -> dict[str, str]:
    env = {name: os.environ[name] for name in ENV_ALLOW_LIST if name in os.environ}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def parse_job_id(job_id: str) -> tuple[str, int] | None:
    host, _, pid = job_id.rpartition(":")
    return (host, int(pid)) if pid.isdigit() else None


def job_lingers(run_id: int, attempt: int, job_id: str) -> bool:
    """Whether a local job's processes still run on this machine (a stopped engine takes up to
    STUDIO_STOP_GRACE_SECONDS to exit, and writes to its run folder until then)."""
    parsed = parse_job_id(job_id or "")
    return parsed is not None and parsed[0] == socket.gethostname() and job_group_alive(parsed[1], run_dir(run_id, attempt))


def process_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def names_attempt(pid: int, directory: Path) -> bool:
    """Whether process `pid` is one of this attempt's: its command line names the attempt's folder (the
    runner's RUN_DIR, the sandbox's plan, the engine's --spec). A job id names its process group by
    number, and the number is another process's once the job has ended and the kernel reuses it (the pid
    space wraps within minutes on a busy machine, and starts again at a reboot): without this, a poll read
    that process as the runner and STOP's SIGKILL took whatever group now has the number."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    folder = str(directory)
    return any(arg == folder or arg.startswith(folder + "/") for arg in argv)


def reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def waiting_message(directory: Path) -> str:
    """Why the attempt's runner waits (its waiting.json), or "" when it does not say."""
    try:
        return str(json.loads((directory / WAITING_NAME).read_text())["message"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def tail_lines(path: Path, n: int = LOG_TAIL_LINES) -> list[str]:
    if not path.is_file():
        return []
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 256 * 1024))
        return f.read().decode(errors="replace").splitlines()[-n:]


class LocalBackend(Backend):
    name = "local"

    def check(self, project, compute: dict) -> list[Finding]:
        # This machine has no region and no spot market: a run that asks for either would get neither.
        findings = [Finding(f"compute.{key}", f"the local backend trains on the Studio's machine, so {what}: remove it, or pick dstack or modal")
                    for key, what in (("region", "a region does not apply"), ("spot", "there are no spot instances"))
                    if compute.get(key)]
        accel = accelerators_of(compute)
        if settings.STUDIO_LOCAL_SANDBOX == "required" and (problem := sandbox_problem()):
            findings.append(Finding("compute.backend", f"this Studio runs local engines only in a sandbox (STUDIO_LOCAL_SANDBOX=required) and this machine "
                                    f"cannot build one ({problem}): allow user namespaces for the Studio's user, or use dstack or modal"))
        if accel.is_cpu:
            return findings
        available = len(local_gpu_devices())
        if accel.count > available:
            findings.append(Finding("compute.accelerators", f"the local backend has {counted(available, 'GPU')} and this run asks for {accel.count}: use CPU here, or a remote backend"))
        return findings

    def reported_path_problem(self, run_id: int, attempt: int, path: str) -> str | None:
        problem = super().reported_path_problem(run_id, attempt, path)
        if problem:
            return problem
        own = output_dir(run_id, attempt).resolve()
        # Where it lies now: a spool file delivered after the Studio's var/ moved names the old place.
        where = relocated(run_id, attempt, path)
        try:
            # Not strict: the folder is checked again, strictly, where it is read (checkpoint_dir).
            folder = where.resolve() if where is not None else own
        except (OSError, RuntimeError, ValueError):
            folder = own
        if folder == own or not folder.is_relative_to(own):
            return f"{path} is not inside this attempt's output folder {own} (links resolved): report only folders the engine saved under its output_dir"
        return None

    def image_has(self, module: str) -> bool:
        from training.validation import local_image_has

        return local_image_has(module)

    def submit(self, job: JobSpec) -> str:
        if refused := studio_data_reads(job):
            raise BackendError("the run names the Studio's own data as a local path, which no engine reads: " + "; ".join(refused))
        directory = run_dir(job.run_id, job.attempt)
        directory.mkdir(parents=True, exist_ok=True)
        for folder in (directory.parent, directory):
            folder.chmod(0o700)  # engine.log and the checkpoints are the project's, not other local users'
        job.output_dir = str(output_dir(job.run_id, job.attempt))
        job.cache_dir = str(directory.parent / "cache")  # shared by the run's attempts (DISTILL's capture); DELETE removes it with the run
        spec_path = directory / "spec.json"
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(job.as_engine_spec(), f, indent=2)
        sandbox: list[str] = []
        if settings.STUDIO_LOCAL_SANDBOX != "off":
            if (problem := sandbox_problem()) is None:
                plan = directory / "sandbox.json"
                plan.write_text(json.dumps(sandbox_plan(job, directory), indent=2))
                sandbox = ["--sandbox", str(plan)]
            elif settings.STUDIO_LOCAL_SANDBOX == "required":
                raise BackendError(f"STUDIO_LOCAL_SANDBOX=required and this machine cannot run the engine in a sandbox ({problem})")
        command = [sys.executable, "-m", "training.backends.local_runner", str(directory), *sandbox, *slot_args(job.compute), "--",
                   *engine_argv(sys.executable, str(spec_path), job.method, job.compute)]
        try:
            runner = subprocess.Popen(command, cwd=REPO_ROOT, env=engine_env(job.env), start_new_session=True,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(directory / "runner.log", "ab"))
        except OSError as exc:
            raise BackendError(f"could not start the engine: {exc}") from exc
        return f"{socket.gethostname()}:{runner.pid}"

    def submit_warnings(self) -> list[str]:
        warning = sandbox_warning()
        return [warning] if warning else []

    def poll(self, run) -> PollResult:
        directory = run_dir(run.pk, run.attempt)
        exit_file = directory / "exit.json"
        parsed = parse_job_id(run.backend_job_id or "")
        if exit_file.is_file():
            if parsed:
                reap(parsed[1])
            return self._exit_result(json.loads(exit_file.read_text()), directory)
        if parsed and parsed[0] == socket.gethostname() and process_alive(parsed[1]) and names_attempt(parsed[1], directory):
            if (directory / "engine.pid").is_file():
                return PollResult("running")
            # The runner waits for its slots (or is about to start the engine): nothing runs, nothing is leased.
            return PollResult("pending", waiting=waiting_message(directory))
        if not parsed:
            return PollResult("pending")
        if exit_file.is_file():  # the runner wrote it and exited between our two looks
            return self._exit_result(json.loads(exit_file.read_text()), directory)
        return PollResult("gone", "training_error", "the runner that supervised the engine is gone without an exit status (it was killed): "
                          "the Studio stops what is left of the job; start the run again", tail_lines(directory / "engine.log"))

    def _exit_result(self, result: dict, directory: Path) -> PollResult:
        # The one exit → error-code table, shared with dstack and Modal (training/backends/mapping.py).
        from training.backends.mapping import exit_result

        # An exit.json without "oom_kills" (written before the runner recorded it) is unknown evidence.
        return exit_result(result.get("returncode"), result.get("signal"), tail_lines(directory / "engine.log"), result.get("oom_kills"))

    def find_job(self, run_id: int, attempt: int) -> str | None:
        """The runner this attempt started, by the pid it wrote (a worker that died between starting
        it and saving the id left a job that trains and reports, but that STOP and polls could not name)."""
        try:
            pid = (run_dir(run_id, attempt) / "runner.pid").read_text().strip()
        except OSError:
            return None
        return f"{socket.gethostname()}:{pid}" if pid.isdigit() else None

    def signal_stop(self, run_id: int, attempt: int, job_id: str) -> None:
        """SIGTERM to the job's group at once: the engine flushes and exits within seconds, whether or
        not a worker is free for stop() to follow it up with the SIGKILL after the grace period."""
        parsed = parse_job_id(job_id)
        if parsed and parsed[0] == socket.gethostname() and job_group_alive(parsed[1], run_dir(run_id, attempt)):
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(parsed[1], signal.SIGTERM)

    def stop(self, run_id: int, attempt: int, job_id: str) -> None:
        parsed = parse_job_id(job_id)
        if not parsed or parsed[0] != socket.gethostname():
            return
        pid, directory = parsed[1], run_dir(run_id, attempt)
        if not job_group_alive(pid, directory):
            reap(pid)
            return  # ended: the group's number may be another process's by now
        try:
            os.killpg(pid, signal.SIGTERM)  # the runner leads its own group (start_new_session)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + settings.STUDIO_STOP_GRACE_SECONDS
        while time.monotonic() < deadline and job_group_alive(pid, directory):
            reap(pid)
            time.sleep(0.1)
        if job_group_alive(pid, directory):
            with suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        reap(pid)

    def logs(self, run, tail: int = LOG_TAIL_LINES) -> list[str]:
        return tail_lines(run_dir(run.pk, run.attempt) / "engine.log", tail)

    def spool_file(self, run) -> Path | None:
        path = output_dir(run.pk, run.attempt) / SPOOL_NAME
        return path if path.is_file() else None

    def output_folder(self, run) -> str:
        return str(output_dir(run.pk, run.attempt))


def group_alive(pgid: int, directory: Path | None = None) -> bool:
    """Whether any live (non-zombie) process is still in process group `pgid` (with `directory`: one
    whose command line names that attempt folder, names_attempt)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid and (directory is None or names_attempt(int(entry.name), directory)):
            return True
    return False


def job_group_alive(pgid: int, directory: Path) -> bool:
    """Whether the job's process group still runs a process of the attempt in `directory`: a group
    whose number the kernel gave to another process since is not the job's, and is never signalled."""
    return group_alive(pgid, directory)
