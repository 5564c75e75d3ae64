"""No test module leaves a process behind.

Many tests start servers, sites, MPI ranks, Flower SuperLinks and SuperNodes or a browser. One
that outlives its module (a SuperNode relaunched after its test ended, an orphaned site that
retries forever) takes CPU from every later test, and on two cores a few of them slow the
whole suite several times over. The session marks its environment (``LABFBO_TEST_SESSION``),
which every process it starts inherits; after each test module, every live process that
carries the mark, other than pytest itself, is killed, and the terminal summary names it with
the module that left it (Linux ``/proc``; elsewhere a no-op). Processes the tests did not
start (another run beside the suite) do not carry the mark and are left alone. Under
pytest-xdist each worker marks and kills its own, and the controller's summary names them all.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

_PROC = Path("/proc")


def _state(pid: int) -> str | None:
    """The state letter of ``pid`` (``Z``: a zombie), or None once it is gone."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()[0]  # after "pid (comm) "


def _cmdline(pid: int) -> str:
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _marked(pid: int, mark: bytes) -> bool:
    try:
        return mark in (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def marked_processes(mark: bytes, me: int) -> dict[int, str]:
    """Live processes (not zombies) other than ``me`` whose environment holds ``mark``."""
    found = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        if _state(int(entry.name)) not in (None, "Z") and _marked(int(entry.name), mark):
            found[int(entry.name)] = _cmdline(int(entry.name))
    return found


class LeftoverGuard:
    """Kills what a test module left running and reports it at the end of the session."""

    def __init__(self) -> None:
        self.enabled = (_PROC / "self" / "environ").exists()
        value = f"{os.getpid()}-{os.urandom(4).hex()}"
        os.environ["LABFBO_TEST_SESSION"] = value
        self.mark = f"LABFBO_TEST_SESSION={value}".encode()
        self.left: list[tuple[str, int, str]] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        yield
        # the last test of a module (its module fixtures have been torn down by now)
        if self.enabled and (nextitem is None or nextitem.module is not item.module):
            for pid, cmd in marked_processes(self.mark, os.getpid()).items():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    continue
                self.left.append((item.module.__name__, pid, cmd[:160]))

    def pytest_sessionfinish(self, session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)  # a pytest-xdist worker: tell the controller
        if workeroutput is not None:
            workeroutput["labfbo_leftovers"] = [list(entry) for entry in self.left]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:  # the controller hears what each worker killed
        self.left += [tuple(entry) for entry in getattr(node, "workeroutput", {}).get("labfbo_leftovers", [])]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.left:
            terminalreporter.section("processes left behind by a test module (killed)")
            for module, pid, cmd in self.left:
                terminalreporter.write_line(f"{module}: pid {pid}: {cmd}")
