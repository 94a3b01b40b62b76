"""The worker side: the durable task class, run context, steps, primitives and run ends."""
