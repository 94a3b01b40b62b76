"""The chaos harness (issue 7): ``python -m tests.chaos.run --minutes N``."""
