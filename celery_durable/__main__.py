"""``python -m celery_durable -A proj …``: the ``celery durable`` commands without ``celery``."""

from celery_durable.cli import main

if __name__ == "__main__":
    main(prog_name="python -m celery_durable")
