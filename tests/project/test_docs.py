"""The README and the docs say what the code does: every Python block runs, and the
generated reference pages list every field.

Each ```` ```python ```` block of ``README.md`` and ``docs/**/*.md`` runs in this process,
in a fresh namespace and a directory of its own, as a reader would paste it. An HTML
comment on the line before a block changes what the test does with it:

* ``<!-- test: skip REASON -->``: only compiled (it needs what a test cannot have, and
  REASON says what);
* ``<!-- test: harness -->``: the block is a line-protocol harness: it is run as the
  command of a ``Command-v0`` env for one turn;
* ``<!-- test: needs-cli NAME -->``: it runs with the real CLI ``NAME`` of ``.clis/`` on
  ``PATH`` (a ``cli`` test, in the loopback-only network namespace).
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cli import cli_path

from gym_harness import HarnessConfig, HarnessEnv
from gym_harness.harnesses.registry import HARNESSES
from gym_harness.rollout.keywords import config_fields, expand_generated

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
_MARK = re.compile(r"^<!-- test: (?P<kind>skip|harness|needs-cli)(?: (?P<arg>.+?))? -->$")


@dataclass(frozen=True)
class Block:
    """A fenced Python block: where it is, its code, and what its marker asks."""

    page: Path
    line: int  # of the opening fence, from 1
    code: str
    kind: str = "run"  # run | skip | harness | needs-cli
    arg: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks(page: Path) -> list[Block]:
    """Every ```` ```python ```` block of ``page``, with the marker on the line before it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks = []
    number = 0
    while number < len(lines):
        fence = _FENCE.match(lines[number])
        if fence is None:
            number += 1
            continue
        indent, closing = fence.group("indent"), fence.group("indent") + "```"
        end = number + 1
        while end < len(lines) and lines[end].rstrip() != closing:
            end += 1
        if fence.group("lang") == "python":
            code = "\n".join(line[len(indent) :] for line in lines[number + 1 : end]) + "\n"
            before = lines[number - 1].strip() if number else ""
            mark = _MARK.match(before)
            kind, arg = (mark.group("kind"), mark.group("arg") or "") if mark else ("run", "")
            blocks.append(Block(page, number + 1, code, kind, arg))
        number = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in python_blocks(page)]


def _param(block: Block) -> object:
    marks = [pytest.mark.cli] if block.kind == "needs-cli" else []
    return pytest.param(block, id=block.where, marks=marks)


@pytest.mark.timeout(600)  # a block takes seconds; the bound leaves room for a shared machine
@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_python_block_runs(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_network: None
) -> None:
    compiled = compile(block.code, block.where, "exec")
    monkeypatch.chdir(tmp_path)
    if block.kind == "skip":
        pytest.skip(f"not run: {block.arg}")
    if block.kind == "harness":
        _run_as_harness(block, tmp_path)
        return
    if block.kind == "needs-cli":
        found = Path(cli_path(block.arg))
        monkeypatch.setenv("PATH", f"{found.parent}{os.pathsep}{os.environ['PATH']}")
    exec(compiled, {"__name__": "__main__"})


def _run_as_harness(block: Block, tmp_path: Path) -> None:
    """One turn of the block as a ``command`` harness with the demo tools; with ``model``,
    in model mode, the test answering each of its model calls."""
    script = tmp_path / "harness.py"
    script.write_text(block.code)
    tools = "gym_harness.agents.demo:DEMO_TOOLS"
    command = [sys.executable, str(script)]
    if block.arg == "model":
        task = {"id": "t", "prompt": "What is 2 + 3?"}
        env = HarnessEnv("command", command=command, tools=tools, mode="model", tasks=[task])
    else:
        env = HarnessEnv("command", command=command, tools=tools)
    try:
        obs, _ = env.reset(seed=0)
        if block.arg == "model":
            assert json.loads(obs)["messages"][-1]["content"] == "What is 2 + 3?"
            final, _, terminated, _, info = env.step("5")
            assert terminated and json.loads(final)["messages"][-1]["content"] == "5"
            reply = HarnessEnv.of(env).trajectory.turns[-1].response
            assert reply == "5", reply
        else:
            reply, _, _, _, info = env.step("hello")
    finally:
        env.close()
    assert info["error_type"] == "", info["error"]
    assert reply, f"{block.where}: the harness replied nothing"


def test_the_pages_are_read_whole() -> None:
    """The block finder sees the blocks (a broken parser would let every page pass)."""
    readme = [b for b in BLOCKS if b.page.name == "README.md"]
    assert len(readme) >= 6
    assert any("gymnasium.make(" in b.code for b in readme)
    assert {b.kind for b in BLOCKS} >= {"run", "skip", "harness", "needs-cli"}


def test_every_skipped_block_says_why() -> None:
    vague = [b.where for b in BLOCKS if b.kind == "skip" and len(b.arg.split()) < 3]
    assert vague == []
    unknown = [b.where for b in BLOCKS if b.kind == "needs-cli" and b.arg not in ("claude",)]
    assert unknown == []


def test_a_marker_that_is_not_before_a_block_is_an_error() -> None:
    """A misspelt or stray marker would leave its block run (or skipped) unseen."""
    stray = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if "<!-- test:" not in line:
                continue
            nxt = lines[number + 1] if number + 1 < len(lines) else ""
            if not (_MARK.match(line.strip()) and nxt.strip() == "```python"):
                stray.append(f"{page.relative_to(ROOT)}:{number + 1}")
    assert stray == []


# ---------------------------------------------------------------- the generated reference


def test_the_configuration_reference_lists_every_harness_config_field() -> None:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert "<!-- generated: config-reference -->" in page.splitlines()
    built = expand_generated("<!-- generated: config-reference -->")  # what the build puts there
    rows = {
        line.split("|")[1].strip().removeprefix("<code>").removesuffix("</code>"): line
        for line in built.splitlines()
        if line.startswith("| <code>")
    }

    def code(text: object) -> str:  # a code cell: its pipes are entities, never ``\\|``
        return f"<code>{html.escape(str(text)).replace('|', '&#124;')}</code>"

    for field in dataclasses.fields(HarnessConfig):
        row = rows.get(field.name)
        assert row is not None, f"HarnessConfig.{field.name} is missing from the reference"
        cells = re.split(r"(?<!\\)\|", row.strip().strip("|"))
        name, kind, default, doc = (cell.strip() for cell in cells)
        assert name == code(field.name)
        assert kind == code(field.type)
        (keyword,) = [k for k in config_fields() if k.name == field.name]
        assert default == code(keyword.default)
        assert doc, f"HarnessConfig.{field.name} has no line in the class's Args: docstring"


def test_every_harness_page_carries_its_generated_options() -> None:
    pages = {p.stem: p.read_text(encoding="utf-8") for p in (DOCS / "harnesses").glob("*.md")}
    every = "\n".join(pages.values())
    for name in HARNESSES:
        assert f"<!-- generated: harness-options {name} -->" in every, name
    assert "generated: env-keywords" in (DOCS / "configuration.md").read_text()


def test_an_unknown_generated_table_fails_the_build() -> None:
    from gym_harness import ConfigError

    with pytest.raises(ConfigError, match="unknown generated table"):
        expand_generated("<!-- generated: nothing-like-this -->\n")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_built_site_shows_types_as_types_and_one_reference_in_its_navigation(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    escaped = [
        f"{page.relative_to(site)}: {line.strip()[:120]}"
        for page in site.rglob("*.html")
        for line in page.read_text(encoding="utf-8").splitlines()
        if "\\|" in line
    ]
    assert escaped == []  # a table's escaped pipe shown as such (`str \| None`)
    home = (site / "index.html").read_text(encoding="utf-8")
    labels = re.findall(r'class="md-ellipsis">\s*([^<]*?)\s*<', home)
    assert labels.count("Reference") <= 1, labels
