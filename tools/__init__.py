"""Scripts that check the repository, run from its root (``python tools/<name>.py``)."""
