"""``gym-harness rollout`` in tmux, a real terminal emulator: what the screen holds at the end.

A pane of a given width runs the command; once it has ended, ``tmux capture-pane`` gives
the screen as a person sees it. The progress bar and the start-up status are drawn over
one another on one line: the last of them must be all that line shows (no residue of a
longer line), and ``wrote ...`` the line under it. With stderr sent to a file, the file
holds a line per episode and no control character. Each tmux server is private to its
test (a socket in ``tmp_path``) and is killed when the test ends.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import LINE_AGENT

#: Each test takes seconds; the bound leaves room for a machine shared with other runs.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Three episodes whose outcomes get shorter: a bar that does not clear the longer one before
#: it shows residue (``(done)urns)``).
_TASKS = "".join(
    json.dumps({"id": f"t{i}", "prompt": prompt}) + "\n"
    for i, prompt in enumerate(["crash", "hello", "/done"])
)


class Pane:
    """A tmux server of its own (socket ``sock``) whose one pane runs a shell command."""

    def __init__(self, sock: Path) -> None:
        self.sock = sock
        self.status = sock.with_suffix(".status")  # the command's exit status, once it ended

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", str(self.sock), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def run(self, command: str, columns: int, cwd: Path) -> None:
        """Run ``command`` in a pane ``columns`` wide; the pane stays (a bounded ``sleep``)
        after it, so the screen is read as the command left it."""
        self.status.unlink(missing_ok=True)
        after = f"echo $? >{shlex.quote(str(self.status))}; exec sleep 300"
        self.tmux(
            "-f", "/dev/null", "new-session", "-d", "-x", str(columns), "-y", "24",
            "-c", str(cwd), f"{command}; {after}",
        )  # fmt: skip

    def wait(self, timeout: float = 240.0) -> int:
        """The command's exit status, once it has ended (polled, bounded)."""
        deadline = time.monotonic() + timeout
        while not self.status.exists() or not self.status.read_text().strip():
            assert time.monotonic() < deadline, self.screen()
            time.sleep(0.2)
        return int(self.status.read_text())

    def screen(self) -> list[str]:
        """The pane's non-empty lines, a line wrapped at the pane's width joined again."""
        shown = self.tmux("capture-pane", "-p", "-J", "-S", "-", "-E", "-").splitlines()
        return [line.rstrip() for line in shown if line.strip()]

    def kill(self) -> None:
        subprocess.run(
            ["tmux", "-S", str(self.sock), "kill-server"],
            capture_output=True,
            timeout=30,
            check=False,
        )


@pytest.fixture
def pane(tmp_path: Path) -> Iterator[Pane]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: apt-get install tmux")
    made = Pane(tmp_path / "tmux.sock")
    try:
        yield made
    finally:
        made.kill()


def _rollout(tmp_path: Path) -> tuple[str, Path]:
    """The shell command of a three-episode rollout, and its ``--out``."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(_TASKS)
    out = tmp_path / "out.jsonl"
    command = json.dumps([sys.executable, str(LINE_AGENT)])
    argv = [sys.executable, "-m", "gym_harness", "rollout", str(tasks)]
    argv += ["--env", "gym_harness/Command-v0", "--set", f"command={command}", "--out", str(out)]
    return shlex.join(argv), out


@pytest.mark.parametrize("columns", [80, 160])
def test_the_last_line_is_exactly_the_final_status(
    pane: Pane, tmp_path: Path, columns: int
) -> None:
    command, out = _rollout(tmp_path)
    pane.run(command, columns, tmp_path)
    assert pane.wait() == 0, pane.screen()
    lines = pane.screen()
    # The start-up status and every bar were drawn over one line: only the last bar is left.
    assert len(lines) == 2, lines
    assert re.fullmatch(r"\[#+\] 3/3 \d+\.\d\d ep/s \(done\)", lines[0]), lines
    assert lines[1] == f"wrote 3 episodes to {out}", lines
    assert len(out.read_text().splitlines()) == 3


@pytest.mark.parametrize("columns", [80, 160])
def test_stderr_to_a_file_has_a_line_per_episode_and_no_control_character(
    pane: Pane, tmp_path: Path, columns: int
) -> None:
    command, out = _rollout(tmp_path)
    log = tmp_path / "stderr.log"
    pane.run(f"{command} 2>{shlex.quote(str(log))}", columns, tmp_path)
    assert pane.wait() == 0, pane.screen()
    said = log.read_text(encoding="utf-8")
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", said), repr(said)
    progress = [line.split(" ", 1)[1] for line in said.splitlines() if "ep/s" in line]
    outcomes = ["(harness_crashed)", "(max_turns)", "(done)"]
    assert [line.split()[0] for line in progress] == ["1/3", "2/3", "3/3"], said
    assert [line.split()[-1] for line in progress] == outcomes, said
    assert pane.screen() == [f"wrote 3 episodes to {out}"]
