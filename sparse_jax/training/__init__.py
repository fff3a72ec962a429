"""The training engine: one loop, checkpointer and step factory for every task.

`loop.run_task(task, workdir)` trains a `task.Task`; the tasks themselves, and
`train_and_evaluate(config, workdir)` which picks one from a config, live above the engine in
`sparse_jax.tasks` (the engine never imports them). The engine's parts: `loop` (the loop and
its `Run`), `task` (what a task supplies), `checkpointing`, `steps` (the step factory),
`optimizer`, `placement` (arrays on the mesh), `metrics_log`, `mfu`, `profiling`,
`routing_health`, `preemption`, `distributed`, `compile_only` (`train.py --compile_only`).
"""
