"""Small helpers every part may use.

* :mod:`~gym_harness.utils.bounded_json`: the one bounded JSON parser (depth, size,
  integer digits) for harness output and captured bodies.
* :mod:`~gym_harness.utils.lines`: splitting a byte stream into bounded lines.
* :mod:`~gym_harness.utils.imports`: import strings (``"package.module:attr"``), and
  the optional dependencies (``import_optional``: a clear ``ConfigError`` naming the extra).
* :mod:`~gym_harness.utils.docstrings`: a Google docstring's ``Args:`` section, read for
  the generated configuration reference and ``--list-keywords``.
* :mod:`~gym_harness.utils.trees`: a fork's directory copies (sized under a bound,
  copy-on-write where the filesystem can).

Imports only ``errors``; every other part may import it, it imports no part.
"""
