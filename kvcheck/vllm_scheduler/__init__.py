"""vLLM's own scheduler in the loop: workloads run through vLLM's ``Scheduler``, offline on CPU, and
every call it makes into its ``KVCacheManager`` checked against the reference model.

- :mod:`~kvcheck.vllm_scheduler.build`: the scheduler a kvcheck configuration describes, and what
  of a configuration it can be asked to run;
- :mod:`~kvcheck.vllm_scheduler.workload`: requests arriving over time, what they sample, when they
  are aborted;
- :mod:`~kvcheck.vllm_scheduler.engine`: the engine loop and its model runner;
- :mod:`~kvcheck.vllm_scheduler.recorder`: the scheduler's allocator calls, read as kvcheck operations;
- :mod:`~kvcheck.vllm_scheduler.check`: the record checked against the model, call by call and step
  by step;
- :mod:`~kvcheck.vllm_scheduler.imitation`: kvcheck's own scheduler held to vLLM's on the same
  operations;
- :mod:`~kvcheck.vllm_scheduler.search`: random cases, and a failing one shrunk.

Nothing here imports vLLM until a scheduler is built.
"""
