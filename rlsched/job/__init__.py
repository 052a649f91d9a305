"""What a job does around and through its iterations, whatever runs them: the runtime's driver of the
iteration core (`iterations`) over the job's parts seen through ports (`ports`), its producer of
single-turn samples (`arrivals`) and its verification bookkeeping (`verification`); the commit log,
checkpoints and resume plan (`durability`), the iteration records (`records`), a clean stop on Ctrl-C
or SIGTERM (`interrupt`), and the supervisor that brings a requeued job back (`supervise`). Plain
Python; the Ray job (`actors/`) implements the ports over its actors and calls it."""
