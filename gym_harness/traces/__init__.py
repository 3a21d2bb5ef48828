"""Token-level training traces: what a trainer needs of an episode's model calls.

This part owns turning recorded model calls (model mode's ``ModelCall`` records, capture
mode's proxy exchanges) into the ``TrainingTrace`` shape trainers consume: one entry per
main model call with the engine's own prompt ids, completion ids, logprobs and a loss
mask. It reads records as plain dicts, so it works on a live trajectory and on a rollout
record read back from disk alike. It never tokenises text, and never imports the env,
the process layer, the servers, or any optional trainer library (``openenv`` included).
"""

from gym_harness.traces.training import SCHEMA_VERSION, record_trace, training_trace

__all__ = ["SCHEMA_VERSION", "record_trace", "training_trace"]
