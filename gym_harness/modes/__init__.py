"""The episode's driver, between the env and the turn runner.

* :mod:`~gym_harness.modes.base`: :class:`Mode`, what the env calls (``start`` at each
  reset, ``step`` per action, ``end`` when the episode ends), and the one
  :class:`Recorder` both modes hand their finished turns to.
* :mod:`~gym_harness.modes.turns`: :class:`TurnMode` (``mode="turns"``): a step is one
  user turn.
* :mod:`~gym_harness.modes.model`: :class:`ModelMode` (``mode="model"``): a step answers
  one model call of the harness.

Below the env: it never imports ``env.py``; what it needs of the env (the closed check)
is a callback handed to the recorder at construction. It drives ``turn.py`` and serves
through ``model/`` (the wire formats and the endpoint).
"""
