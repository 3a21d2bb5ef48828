"""``GroupRollout`` on ``Reference-v0`` in model mode: runs that keep their vector env.

The group is ``support.groups``' scripted one: every episode makes two model calls and
earns reward 1.0.
"""

from __future__ import annotations

import psutil
import pytest

pytest.importorskip(
    "transformers", reason="needs transformers and tokenizers: pip install 'gym_harness[train]'"
)

from support.groups import TASK, scripted_group

from gym_harness.training import EpisodeRow, GroupRollout
from gym_harness.training.tiny import tiny_tokenizer

pytestmark = pytest.mark.timeout(300)


def group_of(concurrency: int, *, keep_envs: bool) -> GroupRollout:
    return scripted_group(tiny_tokenizer(), concurrency, keep_envs=keep_envs)


def _as_scripted(rows: list[EpisodeRow], n: int) -> None:
    assert len(rows) == n
    for row in rows:
        assert (row.error, row.outcome, row.reward) == ("", "", 1.0)
        assert row.calls == row.trained_calls == 2 and row.breaks == 0


def _workers() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


def test_kept_envs_serve_the_next_runs_until_close() -> None:
    with group_of(2, keep_envs=True) as group:
        _as_scripted(group.run([TASK, TASK]), 2)
        workers = _workers()
        assert len(workers) == 2
        _as_scripted(group.run([TASK, TASK, TASK]), 3)  # two waves on the same workers
        _as_scripted(group.run([TASK]), 1)  # a wave on some of them
        assert _workers() == workers
    assert not _workers()  # close() ended and reaped them
    group.close()  # idempotent


def test_a_kept_env_too_small_for_a_run_is_replaced() -> None:
    with group_of(3, keep_envs=True) as group:
        _as_scripted(group.run([TASK]), 1)
        (first,) = _workers()
        _as_scripted(group.run([TASK, TASK]), 2)
        assert len(_workers()) == 2 and first not in _workers()
    assert not _workers()


def test_without_keep_envs_each_run_ends_its_workers() -> None:
    group = group_of(2, keep_envs=False)
    _as_scripted(group.run([TASK, TASK]), 2)
    assert not _workers()
