"""The chaos harness (docs/guarantees.md): ``python -m tests.chaos.run --minutes N``."""
