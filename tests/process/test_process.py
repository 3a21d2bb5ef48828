"""HarnessProcess against real fake-harness processes (tests/support/scripts/harness.py).

Every test also runs under the autouse guard in conftest.py, which fails it if any
process of ours is left running; tests that know pids check them explicitly too.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from support.process import is_ready, running, spec, wait_gone

from gym_harness.config import ProcessSpec
from gym_harness.errors import (
    ConfigError,
    HarnessCrashed,
    HarnessStartError,
    TurnTimeout,
)
from gym_harness.process.harness_process import (
    MARKER_VAR,
    SESSION_VAR,
    HarnessProcess,
    ProcessUsage,
)
from gym_harness.readiness import start_ready

MB = 1024 * 1024


def read_until(proc: HarnessProcess, wanted: str, timeout_s: float = 10.0) -> list[str]:
    """Read lines until ``wanted`` (included); fail on EOF or after ``timeout_s``."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.read_line(timeout_s=deadline - time.monotonic())
        if line is None:
            break
        lines.append(line)
        if line == wanted:
            return lines
    pytest.fail(f"no {wanted!r} line; got {lines[-3:]!r}, eof={proc.eof}")


def test_echo_round_trip_and_stop() -> None:
    with HarnessProcess(spec("echo")) as proc:
        start_ready(proc, is_ready)
        assert proc.pid is not None and proc.is_alive() and proc.returncode is None
        proc.write_line("héllo {}", timeout_s=10)
        assert proc.read_line(timeout_s=10) == "héllo {}"
        assert proc.read_line(timeout_s=0.05) is None
        assert not proc.eof
    assert not proc.is_alive()
    assert proc.returncode is not None
    assert proc.eof and proc.read_line(timeout_s=10) is None
    assert wait_gone([proc.pid]) == []
    proc.stop()  # idempotent


def test_start_without_ready_returns_at_once_and_keeps_every_line() -> None:
    with HarnessProcess(spec("never_ready")) as proc:
        proc.start()
        assert read_until(proc, "starting...") == ["starting..."]


def test_never_ready_times_out_and_leaves_nothing() -> None:
    proc = HarnessProcess(spec("never_ready"))
    with pytest.raises(HarnessStartError, match="startup_timeout_s") as info:
        start_ready(proc, is_ready, timeout_s=0.5)
    assert info.value.exit_code is None
    assert info.value.pid == proc.pid is not None
    assert wait_gone([proc.pid]) == []


def test_exit_during_startup_reports_code_and_stderr() -> None:
    proc = HarnessProcess(spec("exit_early"))
    with pytest.raises(HarnessStartError, match=r"exited during startup \(exit code 3\)") as info:
        start_ready(proc, is_ready)
    assert info.value.exit_code == 3
    assert "ANTHROPIC_API_KEY is not set" in info.value.stderr_tail
    assert "ANTHROPIC_API_KEY is not set" in str(info.value)
    assert info.value.pid is not None and not running(info.value.pid)


@pytest.mark.parametrize(
    ("command", "cwd"),
    [(("no-such-harness-xyz",), None), ((sys.executable, "-c", "pass"), "/no/such/dir")],
)
def test_unstartable_command_raises_start_error(command: tuple[str, ...], cwd: str | None) -> None:
    proc = HarnessProcess(ProcessSpec(command=command, cwd=cwd))
    with pytest.raises(HarnessStartError, match="harness"):
        start_ready(proc, is_ready)
    assert proc.pid is None and not proc.is_alive()
    proc.stop()


def test_misuse_is_reported() -> None:
    with pytest.raises(ConfigError, match="command"):
        HarnessProcess(ProcessSpec())
    proc = HarnessProcess(spec("echo"))
    with pytest.raises(HarnessCrashed, match="new harness"):
        proc.write_line("too early", timeout_s=10)
    with proc:
        start_ready(proc, is_ready)
        with pytest.raises(HarnessStartError, match="new HarnessProcess"):
            start_ready(proc, is_ready)


def test_crash_mid_turn_is_eof_then_crashed_on_write() -> None:
    with HarnessProcess(spec("crash")) as proc:
        start_ready(proc, is_ready)
        proc.write_line('{"type":"message","content":"hi"}', timeout_s=10)
        assert proc.read_line(timeout_s=10) == '{"type":"text","text":"half a rep'
        assert proc.read_line(timeout_s=10) is None
        assert proc.eof
        deadline = time.monotonic() + 5
        while proc.returncode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.returncode == 3 and not proc.is_alive()
        with pytest.raises(HarnessCrashed) as info:
            proc.write_line("anyone there?", timeout_s=10)
        assert info.value.exit_code == 3


def test_sigterm_ignored_means_sigkill_after_grace() -> None:
    proc = HarnessProcess(spec("ignore_term", stop_grace_s=0.3))
    start_ready(proc, is_ready)
    proc.stop()
    assert proc.returncode == -9
    assert wait_gone([proc.pid]) == []  # type: ignore[list-item]


@pytest.mark.timeout(60)
def test_floods_on_stdout_and_stderr_do_not_deadlock() -> None:
    with HarnessProcess(spec("flood", stderr_tail_lines=5)) as proc:
        start_ready(proc, is_ready)
        proc.write_line("go", timeout_s=10)
        lines = read_until(proc, "done", timeout_s=50)
        assert sum(len(line) + 1 for line in lines[:-1]) == 50 * MB
        tail = proc.stderr_tail().split("\n")
        assert len(tail) == 5 and all(line == "x" * 1023 for line in tail)
        proc.write_line("still here", timeout_s=10)
        assert proc.read_line(timeout_s=10) == "still here"


@pytest.mark.timeout(30)
def test_stop_works_while_the_harness_blocks_on_unread_output() -> None:
    proc = HarnessProcess(spec("flood", max_line_bytes=64 * 1024))
    start_ready(proc, is_ready)
    proc.write_line(
        "go", timeout_s=10
    )  # 50 MB that nobody reads: the pipe fills, the harness blocks
    assert proc.read_line(timeout_s=10) == "x" * 1023
    proc.stop()
    assert not proc.is_alive() and proc.eof
    assert wait_gone([proc.pid]) == []  # type: ignore[list-item]


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    with HarnessProcess(spec("bad_utf8")) as proc:
        start_ready(proc, is_ready)
        assert proc.read_line(timeout_s=10) == "bad \ufffd\ufffd here \ufffd("
        assert proc.read_line(timeout_s=10) == "after"
        proc.write_line("ok", timeout_s=10)
        assert proc.read_line(timeout_s=10) == "ok"
        # stderr is drained by its own thread: its line may land after stdout's.
        deadline = time.monotonic() + 5
        while not proc.stderr_tail() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.stderr_tail() == "err \ufffd\ufffd"


@pytest.mark.timeout(60)
def test_a_20mb_line_is_cut_while_read() -> None:
    with HarnessProcess(spec("long_line", max_line_bytes=MB)) as proc:
        tracemalloc.start()
        try:
            start_ready(proc, is_ready)
            line = proc.read_line(timeout_s=30)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert line == "y" * MB + f" …[cut {19 * MB} bytes]"
        assert peak < 8 * MB  # never the whole 20 MB line
        assert proc.read_line(timeout_s=10) == "after"


@pytest.mark.timeout(30)
def test_closed_stdout_is_a_lasting_eof_while_alive() -> None:
    with HarnessProcess(spec("close_stdout")) as proc:
        start_ready(proc, is_ready)
        proc.write_line("close it", timeout_s=10)
        assert proc.read_line(timeout_s=10) is None
        assert proc.eof and proc.is_alive()
        # A wait here would hit the 30 s test timeout: at EOF read_line returns at once.
        for _ in range(3):
            assert proc.read_line(timeout_s=600) is None
        pid = proc.pid
    assert wait_gone([pid]) == []  # type: ignore[list-item]


def test_last_activity_counts_stderr_and_tail_is_bounded() -> None:
    with HarnessProcess(spec("echo", stderr_tail_lines=3)) as proc:
        start_ready(proc, is_ready)
        before = proc.last_activity
        for n in range(5):
            proc.write_line(f"err:line {n}", timeout_s=10)
        proc.write_line(
            "sync", timeout_s=10
        )  # stdout echo arrives after the stderr lines were written
        assert proc.read_line(timeout_s=10) == "sync"
        deadline = time.monotonic() + 5
        while proc.stderr_tail() != "line 2\nline 3\nline 4" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.stderr_tail() == "line 2\nline 3\nline 4"
        assert proc.last_activity > before


def test_environment_is_scrubbed_and_marked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GYM_TEST_SECRET", "must not leak")
    cfg = spec("env", inherit_env=("PATH",), env={"EXTRA": "1"}, cwd=str(tmp_path))
    with HarnessProcess(cfg) as first, HarnessProcess(cfg) as second:
        seen = []
        for proc in (first, second):
            start_ready(proc, is_ready)
            seen.append(json.loads(proc.read_line(timeout_s=10) or "{}"))
    for report in seen:
        # Python itself may add LC_CTYPE (PEP 538 locale coercion) in the child.
        assert set(report["env"]) - {"LC_CTYPE"} == {"PATH", "EXTRA", MARKER_VAR, SESSION_VAR}
        assert report["env"][SESSION_VAR] == os.environ[SESSION_VAR]
        assert report["cwd"] == str(tmp_path)
    assert seen[0]["env"][MARKER_VAR] != seen[1]["env"][MARKER_VAR]


def test_usage_counts_the_tree() -> None:
    with HarnessProcess(spec("echo")) as proc:
        start_ready(proc, is_ready)
        usage = proc.usage()
        assert isinstance(usage, ProcessUsage)
        assert usage.num_processes == 1 and usage.rss_bytes > MB and usage.cpu_seconds >= 0
    assert proc.usage() == ProcessUsage(rss_bytes=0, cpu_seconds=0.0, num_processes=0)


def test_write_to_a_harness_that_never_reads_times_out() -> None:
    with HarnessProcess(spec("never_ready")) as proc:
        proc.start()
        with pytest.raises(TurnTimeout, match="stdin"):
            proc.write_line("z" * (4 * MB), timeout_s=0.3)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("wake", ["byte", "writer_closed"])
def test_a_readable_wake_fd_ends_the_wait_and_stays_unread(wake: str) -> None:
    wake_r, wake_w = os.pipe()
    try:
        with HarnessProcess(spec("echo")) as proc:
            start_ready(proc, is_ready)

            def wake_up() -> None:
                time.sleep(0.2)  # the reader is waiting by then (or soon: either way it wakes)
                if wake == "byte":
                    os.write(wake_w, b"!")
                else:
                    os.close(wake_w)

            waker = threading.Thread(target=wake_up)
            waker.start()
            # Without the wake-up this would wait 600 s, past the test's 60 s timeout.
            assert proc.read_line(timeout_s=600, wake_fd=wake_r) is None
            waker.join(10)
            assert not proc.eof and proc.is_alive()
            if wake == "byte":
                assert os.read(wake_r, 16) == b"!"  # not consumed by read_line
            # The wake fd is no longer polled: stdout reads as before.
            proc.write_line("after", timeout_s=10)
            assert proc.read_line(timeout_s=10) == "after"
    finally:
        os.close(wake_r)
        if wake == "byte":
            os.close(wake_w)


@pytest.mark.timeout(60)
def test_a_readable_wake_fd_loses_no_output() -> None:
    wake_r, wake_w = os.pipe()
    try:
        with HarnessProcess(spec("echo")) as proc:
            start_ready(proc, is_ready)
            os.write(wake_w, b"!")  # readable throughout
            proc.write_line("one", timeout_s=10)
            proc.write_line("two", timeout_s=10)
            seen: list[str] = []
            while len(seen) < 2:  # bounded: every pass adds a line or fails
                line = proc.read_line(timeout_s=10, wake_fd=wake_r)
                if line is None:  # woken: what the harness wrote is still there to read
                    line = proc.read_line(timeout_s=10)
                assert line is not None
                seen.append(line)
            assert seen == ["one", "two"]
            assert os.read(wake_r, 16) == b"!"
    finally:
        os.close(wake_r)
        os.close(wake_w)


def test_write_line_needs_a_bound() -> None:
    with HarnessProcess(spec("echo")) as proc:
        start_ready(proc, is_ready)
        with pytest.raises(TypeError, match="timeout_s or deadline"):
            proc.write_line("unbounded")
        proc.write_line("bounded", deadline=time.monotonic() + 10)
        assert proc.read_line(timeout_s=10) == "bounded"
