"""``gym-harness rollout``'s output file under signals and a full disk, and ``--resume``.

Real signals to a real command, a real full disk (a small tmpfs mounted in a mount
namespace of the test's own), real harness processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from support import LINE_AGENT

from gym_harness.rollout.outfile import RecordFile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CLI = [sys.executable, "-m", "gym_harness.rollout.cli"]

#: The line agent, waiting an hour before it answers while the test's folder holds
#: ``hold`` and the workspace a ``gate`` file; its argv names the test's folder, so a
#: leftover process is found, and the line agent, so the sandbox lets the harness read it.
GATED_AGENT = """
import os, sys
folder, line_agent = sys.argv[1:3]
held = os.path.exists(os.path.join(folder, "hold")) and os.path.exists("gate")
delay = "3600" if held else "0"
os.execv(sys.executable, [sys.executable, line_agent, "echo", "--delay", delay, folder])
"""


def records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    assert text == "" or text.endswith("\n"), "a cut line"
    return [json.loads(line) for line in text.splitlines()]


def leftovers(tag: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with_tag = any(tag in part for part in proc.info["cmdline"] or ())
        if with_tag and proc.pid != os.getpid():
            found.append(" ".join(proc.info["cmdline"]))
    return found


def gated_rollout(tmp_path: Path, *extra: str) -> list[str]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        '{"id": "t0", "prompt": "/done"}\n'  # answers at once; the others wait on "hold"
        + "".join(f'{{"id": "t{k}", "prompt": "/done", "files": {{"gate": ""}}}}\n' for k in (1, 2))
    )
    agent = tmp_path / "gated_agent.py"
    agent.write_text(GATED_AGENT)
    command = json.dumps([sys.executable, str(agent), str(tmp_path), str(LINE_AGENT)])
    argv = [*CLI, "rollout", str(tasks), "--env", "gym_harness/Command-v0"]
    return [*argv, "--set", f"command={command}", "--out", str(tmp_path / "out.jsonl"), *extra]


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_keeps_the_written_records_and_resume_finishes_the_file(
    tmp_path: Path, signum: int, status: int
) -> None:
    (tmp_path / "hold").touch()
    out = tmp_path / "out.jsonl"
    out.write_text('{"kept": true}\n')
    partial = tmp_path / "out.jsonl.partial"
    with subprocess.Popen(gated_rollout(tmp_path), stderr=subprocess.PIPE, text=True) as child:
        try:
            assert child.stderr is not None
            seen = ""
            while "1/3" not in seen:  # the first record is written; the second episode waits
                line = child.stderr.readline()
                assert line, f"the rollout ended early: {seen}"
                seen += line
            assert len(records(partial)) == 1  # streamed: visible before the rollout ends
            child.send_signal(signum)
            assert child.wait(timeout=60) == status
            said = child.stderr.read()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    name = signal.Signals(signum).name
    assert f"interrupted ({name}) with 1 of 3 records written" in said, said
    assert "--resume" in said
    assert out.read_text() == '{"kept": true}\n'  # untouched
    assert [r["task_id"] for r in records(partial)] == ["t0"]
    assert leftovers(str(tmp_path)) == []

    (tmp_path / "hold").unlink()
    done = subprocess.run(
        [*gated_rollout(tmp_path), "--resume"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "wrote 3 episodes" in done.stdout
    finished = records(out)
    assert sorted((r["task_id"], r["episode_index"]) for r in finished) == [
        ("t0", 0),
        ("t1", 0),
        ("t2", 0),
    ]
    assert [r["outcome"] for r in finished] == ["done"] * 3, finished[-1]["error"]
    assert not partial.exists()


def test_resume_of_a_finished_file_runs_nothing_and_drops_a_cut_line(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "prompt": "/done a"}\n')
    out = tmp_path / "out.jsonl"
    argv = [*CLI, "rollout", str(tasks), "-n", "2", "--out", str(out)]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    whole = out.read_text()
    # A crash mid-line (not one of ours) and a duplicate line: resume keeps each episode once.
    lines = whole.splitlines(keepends=True)
    (tmp_path / "out.jsonl.partial").write_text(lines[0] + lines[0] + lines[1][:40])
    again = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "wrote 2 episodes" in again.stdout
    kept = records(out)
    assert sorted(r["episode_index"] for r in kept) == [0, 1]
    assert kept[0] == json.loads(lines[0])  # the recorded one was not run again


def on_a_small_disk(
    disk: Path, before: str, argv: list[str], after: str
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a mount namespace of its own where ``disk`` is a 64 KiB tmpfs:
    ``before`` and ``after`` are shell commands run around it; the ``CompletedProcess``
    (its status ``argv``'s)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1)")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    disk.mkdir()
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {disk} || exit 99; {before}; "
        f'"$@"; status=$?; {after}; exit $status'
    )
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        timeout=400,
    )


def test_a_full_disk_leaves_whole_records_and_exits_with_the_io_status(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "prompt": "/done a"}\n')
    disk, copy = tmp_path / "disk", tmp_path / "copy.jsonl"
    out = disk / "out.jsonl"
    argv = [*CLI, "rollout", str(tasks), "-n", "12", "--concurrency", "3", "--out", str(out)]
    # 56 of the 64 KiB taken: room for a few records (about 1.2 KB each).
    done = on_a_small_disk(
        disk,
        f"head -c 57344 /dev/zero > {disk}/filler",
        argv,
        f"cp {out}.partial {copy}; ls {disk} > {tmp_path}/listing",
    )
    assert done.returncode == 74, done.stderr
    kept = records(copy)  # whole lines only
    assert 0 < len(kept) < 12
    message = done.stderr.strip().splitlines()[-1]
    assert f"cannot write {out}.partial" in message
    assert re.search(rf"\b{len(kept)} whole records? kept in {out}.partial", message), message
    assert "out.jsonl\n" not in (tmp_path / "listing").read_text()  # no OUT made
    assert leftovers(str(tmp_path)) == []


def test_a_resume_on_a_full_disk_exits_with_the_io_status_and_keeps_the_records(
    tmp_path: Path,
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "prompt": "/done a"}\n')
    earlier = tmp_path / "earlier.jsonl"
    argv = [*CLI, "rollout", str(tasks), "-n", "2", "--out", str(earlier)]
    subprocess.run(argv, capture_output=True, check=True, timeout=120)
    disk, copy = tmp_path / "disk", tmp_path / "copy.jsonl"
    out = disk / "out.jsonl"
    argv = [*CLI, "rollout", str(tasks), "-n", "3", "--out", str(out), "--resume"]
    # The earlier run's records as OUT.partial, then the disk filled to the last byte.
    done = on_a_small_disk(
        disk,
        f"cp {earlier} {out}.partial; head -c 65536 /dev/zero > {disk}/filler 2>/dev/null",
        argv,
        f"cp {out}.partial {copy}",
    )
    assert done.returncode == 74, done.stderr
    assert f"cannot resume into {out}.partial" in done.stderr
    assert copy.read_bytes() == earlier.read_bytes()  # the records as they were
    assert leftovers(str(tmp_path)) == []


def test_a_failed_write_is_truncated_back_and_not_counted(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl.partial"
    written = RecordFile(path)
    written.write('{"a": 1}\n')
    os.close(written.fd)
    written.fd = os.open(path, os.O_RDONLY)  # a write now fails (EBADF) as EIO would
    with pytest.raises(OSError):
        written.write('{"b": 2}\n')
    written.close()
    assert written.records == 1
    assert written.failed is not None
    assert path.read_text() == '{"a": 1}\n'


def test_a_signal_between_short_writes_leaves_no_cut_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.jsonl.partial"
    written = RecordFile(path)
    written.write('{"a": 1}\n')
    real_write = os.write

    def short_then_signal(fd: int, data: Any) -> int:
        if len(data) > 4:
            return real_write(fd, data[:4])  # a short write, as near a full disk
        raise KeyboardInterrupt  # the signal's handler runs before the rest is written

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", short_then_signal)
        with pytest.raises(KeyboardInterrupt):
            written.write('{"b": 2}\n')
    written.close()
    assert written.records == 1
    assert written.failed is None
    assert path.read_text() == '{"a": 1}\n'
