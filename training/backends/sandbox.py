"""Runs the local backend's engine in a sandbox that shows it only what its run needs. Imports no Django.

    python -m training.backends.sandbox PLAN.json -- COMMAND...
    python -m training.backends.sandbox --probe

The engine imports GRPO environment packages that any project member can upload, and it runs as the
Studio's own OS user: filtering its environment is not enough. This puts it in new Linux namespaces
(a user namespace too when not root, so an unprivileged worker can do it):

- a mount namespace where the plan's `hide` folders (the checkout among them) are covered by an
  empty tmpfs and its `hide_files` by /dev/null, then only what the run reads is bound back
  (`read_only`, `read_write`; a symbolic link is made again, pointing where it pointed);
- a PID namespace with its own /proc, so no Studio process (its environ, cwd or open files) is in reach.

The engine then runs with no capabilities and no_new_privs, so it cannot undo a mount. Processes: this
one, outside the PID namespace, mirrors the engine's exit (a signal too) to the runner; its child is
the namespace's pid 1, which reaps and whose end ends every process inside (torchrun's ranks too);
the engine is pid 2, in the runner's process group, so STOP's SIGTERM reaches it as before.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
# statvfs's f_flag bits (ST_*) → the mount flags a remount must keep: in a user namespace the kernel
# refuses to clear the ones the mount was made with.
KEPT_FLAGS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME, 4096: MS_RELATIME}
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 28, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECBIT_NOROOT_AND_LOCKS = 0x3F  # noroot, no_setuid_fixup, keep_caps_locked and their locks
CAPABILITY_VERSION_3 = 0x20080522
SETUP_FAILED = 125  # the sandbox could not be built: nothing of the engine ran

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class SandboxError(Exception):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def _prctl(option: int, arg: int = 0) -> int:
    return _libc.prctl(option, arg, 0, 0, 0)


def _remount_read_only(target: str) -> None:
    kept = sum(flag for bit, flag in KEPT_FLAGS.items() if os.statvfs(target).f_flag & bit)
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | kept)


def enter_namespaces() -> None:
    """New user (unless root), mount and PID namespaces for this process; the PID one holds its children."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWPID | (0 if uid == 0 else CLONE_NEWUSER)), "unshare")
    if uid != 0:  # the same ids inside: the engine's files stay the Studio user's
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the Studio's own mounts


def _covered(path: str, folders: list[str]) -> bool:
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in folders)


def build_mounts(plan: dict) -> None:
    """Hide, then bind back. The bound paths are opened first: the tmpfs covers their way in."""
    binds = sorted([(p, False) for p in plan.get("read_only", [])] + [(p, True) for p in plan.get("read_write", [])])
    opened: list[tuple[str, bool, int]] = []
    links: dict[str, str] = {}
    for path, writable in binds:
        if os.path.islink(path):
            links[path] = os.readlink(path)
        elif os.path.exists(path) and not _covered(path, [p for p, _, _ in opened]):
            opened.append((path, writable, os.open(path, os.O_PATH | os.O_CLOEXEC)))
    hidden: list[str] = []
    for folder in sorted(plan.get("hide", [])):
        if os.path.isdir(folder) and not _covered(folder, hidden):
            _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
            hidden.append(folder)
    for file in plan.get("hide_files", []):
        if os.path.lexists(file) and not os.path.isdir(file) and not _covered(file, hidden):
            _mount("/dev/null", file, None, MS_BIND)
    for path, target in links.items():
        if _covered(path, hidden):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.symlink(target, path)
    for path, writable, fd in opened:
        if not _covered(path, hidden):
            os.close(fd)
            continue  # never hidden: the engine sees it as it is
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            Path(path).touch()
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
        if not writable:
            _remount_read_only(path)


def drop_privileges() -> None:
    """No capability now or after exec (root's too), and no way back: a mount cannot be undone."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    _prctl(PR_SET_SECUREBITS, SECBIT_NOROOT_AND_LOCKS)
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    _check(_libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")


def _init(command: list[str], cwd: str, status_out: int) -> None:
    """Pid 1 of the namespace: starts the engine, reaps every process, reports the engine's status."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the runner's `kill -9` of the sandbox ends all inside
        _check(_libc.unshare(CLONE_NEWNS), "unshare")  # its /proc: the parent keeps reading the Studio's
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the engine gets the group's signals itself
        engine = os.fork()
        if engine == 0:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.chdir(cwd)  # again: the old working directory is a way under the mounts
            drop_privileges()
            os.execvp(command[0], command)
    except BaseException as exc:  # noqa: BLE001 - a child of fork must never return into the caller
        print(f"sandbox: {exc}", file=sys.stderr, flush=True)
        os._exit(SETUP_FAILED)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(SETUP_FAILED)
        if pid == engine:
            os.write(status_out, str(status).encode())
            os._exit(0)  # the kernel ends whatever the engine left running in the namespace


def engine_pid(init: int, timeout: float = 5.0) -> int | None:
    """The engine's pid as the Studio sees it: the init's child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
        except OSError:
            return None
        if children:
            return int(children[0])
        time.sleep(0.01)
    return None


def run(plan: dict, command: list[str]) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as the runner: outlive the engine to report its exit
    try:
        enter_namespaces()
        build_mounts(plan)
    except Exception as exc:  # noqa: BLE001 - whatever stopped it, the engine must not start unsandboxed
        print(f"sandbox: the engine's sandbox could not be built ({exc}); set STUDIO_LOCAL_SANDBOX=off to run it without one",
              file=sys.stderr, flush=True)
        return SETUP_FAILED
    status_in, status_out = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(status_in)
        _init(command, plan.get("cwd") or os.getcwd(), status_out)
    os.close(status_out)
    if plan.get("pid_file"):
        with suppress(OSError):
            Path(plan["pid_file"]).write_text(str(engine_pid(init) or init))
    _, init_status = os.waitpid(init, 0)
    with os.fdopen(status_in) as reported:
        text = reported.read()
    status = int(text) if text else init_status
    if os.WIFSIGNALED(status):
        if os.WTERMSIG(status) not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    return os.waitstatus_to_exitcode(status)


def probe() -> int:
    """Whether this process may build a sandbox here: the same steps as run(), on a scratch folder,
    down to starting this Python inside (the kernel may refuse it a path that it allows outside)."""
    with tempfile.TemporaryDirectory() as scratch:
        os.mkdir(os.path.join(scratch, "run"))
        child = os.fork()
        if child == 0:  # in a child: the scratch folder is removed from outside the namespaces
            os._exit(run({"hide": [scratch], "read_write": [os.path.join(scratch, "run")], "cwd": "/"}, [sys.executable, "-c", ""]))
        return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])


def main(argv: list[str]) -> int:
    if argv == ["--probe"]:
        return probe()
    if len(argv) < 3 or argv[1] != "--":
        print("usage: sandbox PLAN.json -- COMMAND...  |  sandbox --probe", file=sys.stderr)
        return 2
    return run(json.loads(Path(argv[0]).read_text()), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
