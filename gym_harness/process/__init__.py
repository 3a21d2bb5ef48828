"""The process layer: the only part that starts and ends processes.

* :mod:`~gym_harness.process.harness_process`: ``HarnessProcess``, one supervised
  harness (its pipes, reader threads, liveness and stop).
* :mod:`~gym_harness.process.keeper`: the keeper process, the harness's parent and a
  subreaper of its tree (run as a script, standard library only).
* :mod:`~gym_harness.process.keeper_client`: the owner's side of the keepers (spawn
  requests, a watcher thread, the pool of idle keepers; ``hold``/``unhold`` keep one
  ready between harnesses).
* :mod:`~gym_harness.process.child`: a harness started by a keeper, as its owner sees it.
* :mod:`~gym_harness.process.forkexec`: what the keeper's child does between fork and
  exec (standard library only, loaded by the keeper by file path).
* :mod:`~gym_harness.process.procfs`: what the keeper reads and removes in ``/proc``,
  cgroupfs and the filesystem (standard library only, loaded the same way).
* :mod:`~gym_harness.process.confine`: the kernel confinement a harness gets between
  fork and exec (Landlock, no-new-privs, capabilities, seccomp; standard library only,
  loaded by the keeper by file path).
* :mod:`~gym_harness.process.view`: the harness's own mount namespace, which shows only
  what it is granted (loaded by ``confine`` by file path).
* :mod:`~gym_harness.process.seccomp`: the seccomp filter, what it refuses and why
  (loaded the same way).
* :mod:`~gym_harness.process.sandbox`: what a confined harness may reach, and what this
  kernel enforces of it (``HarnessConfig.sandbox``).
* :mod:`~gym_harness.process.netns`: an env's own network namespace (``"strict"``).
* :mod:`~gym_harness.process.resources`: what one env owns that must end with it.
* :mod:`~gym_harness.process.tree`: finding and ending a harness's whole tree.
* :mod:`~gym_harness.process.workspaces`: the episode directories the keepers remove
  when their owner dies.

Imports only ``config``, ``errors``, ``lifecycle``, ``tasks`` and ``utils``; never the
bridge, capture, model, adapters or the env (it knows nothing of episodes).
"""
