"""Records: what leaves an episode, at the ground of the package.

* :mod:`~gym_harness.records.events`: ``HarnessEvent``, ``EventType``, ``TurnResult``.
* :mod:`~gym_harness.records.trajectory`: ``StepInfo``, ``TurnRecord``, ``Trajectory``,
  ``RewardContext``, ``RewardFn``.
* :mod:`~gym_harness.records.calls`: ``ModelCall`` (one model call of model mode) and the
  ``Completion`` it carries.
* :mod:`~gym_harness.records.exchanges`: ``ModelExchange`` and the parsed records of a
  captured model call.
* :mod:`~gym_harness.records.chat_format`: exchanges as chat messages and datasets.
* :mod:`~gym_harness.records.training`: the token-level training trace, built from the
  records alone (never re-tokenised).
* :mod:`~gym_harness.records.display`: a trajectory as HTML for Jupyter.

Everyone imports this part; it imports only the vocabulary (``errors``, ``outcome``,
``config``, ``utils``), never a part that runs an episode (env, modes, turn runner,
model, harnesses, servers, processes) and no trainer library. Nothing is imported here.
"""
