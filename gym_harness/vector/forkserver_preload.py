"""Imported by the forkserver (``set_forkserver_preload``): forks inherit the server stack."""

from gym_harness.vector.preload import preload_server_stack

preload_server_stack()
