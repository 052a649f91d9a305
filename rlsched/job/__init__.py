"""What a job does around its iterations, whatever drives them: the commit log, checkpoints and
resume plan (`durability`), the iteration records (`records`), a clean stop on Ctrl-C or SIGTERM
(`interrupt`), and the supervisor that brings a requeued job back (`supervise`). Plain Python; the Ray
driver (`actors/`) calls it."""
