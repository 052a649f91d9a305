"""State that must survive a process: the durable partial outputs of in-flight generations."""
