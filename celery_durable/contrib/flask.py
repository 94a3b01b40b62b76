"""celery_durable for Flask: an extension following Flask's "Background Tasks with Celery".

Usage (docs/flask.md)::

    durable_ext = DurableExtension()

    def create_app():
        app = Flask(__name__)
        app.config.from_mapping(CELERY={"broker_url": "redis://localhost",
                                        "durable_url": "postgresql://db/app"})
        durable_ext.init_app(app)      # makes app.extensions["celery"] as Flask's docs do
        return app

``init_app`` uses ``app.extensions["celery"]`` when the application made its Celery app
already (Flask's ``celery_init_app``); otherwise it makes one exactly as that recipe does: a
``FlaskTask`` that runs every task inside ``app.app_context()``, configured from
``app.config["CELERY"]`` (lower-case Celery keys, ``durable_url`` among them), set as the
default app. ``app.extensions["celery_durable"]`` is the :class:`~celery_durable.Durable`.

Durable tasks can be declared before any application exists, like ``@shared_task``:
``@durable_ext.task(name="…")`` registers the function on every application the extension is
initialised with, and returns a proxy to the task of the current application.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import Celery, Task
from celery.local import Proxy

from celery_durable.durable import Durable

if TYPE_CHECKING:
    from flask import Flask

__all__ = ["EXTENSION_KEY", "DurableExtension", "celery_init_app"]

EXTENSION_KEY = "celery_durable"
"""``app.extensions[EXTENSION_KEY]`` is the application's ``Durable``."""


def celery_init_app(app: Flask) -> Celery:
    """Flask's documented recipe: a Celery app whose tasks run in the Flask app context.

    Configured from ``app.config["CELERY"]`` (a dict of lower-case Celery settings), set as
    the default Celery app, and stored in ``app.extensions["celery"]``.
    """

    class FlaskTask(Task):
        def __call__(self, *args: object, **kwargs: object) -> object:
            with app.app_context():
                return self.run(*args, **kwargs)

    celery_app = Celery(app.name, task_cls=FlaskTask)
    celery_app.config_from_object(dict(app.config.get("CELERY") or {}))
    celery_app.set_default()
    app.extensions["celery"] = celery_app
    return celery_app


class DurableExtension:
    """Binds a Flask application to a Celery app and its durable journal.

    ``DurableExtension(app)`` or ``ext = DurableExtension()`` then ``ext.init_app(app)``.
    """

    def __init__(self, app: Flask | None = None) -> None:
        self._tasks: list[tuple[Callable[..., Any], dict[str, Any]]] = []
        self._durables: list[Durable] = []
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> Durable:
        """Make (or reuse) the Celery app and its ``Durable``; register deferred tasks.

        The journal URL is ``app.config["CELERY"]["durable_url"]``, else the
        ``CELERY_DURABLE_URL`` environment variable, else ``sqlite:///celery_durable.db``.
        """
        celery_app = app.extensions.get("celery")
        if celery_app is None:
            celery_app = celery_init_app(app)
        if not isinstance(celery_app, Celery):
            raise TypeError(
                f'app.extensions["celery"] must be a Celery app, not {type(celery_app).__name__}'
            )
        durable = Durable.for_app(celery_app)
        for fun, options in self._tasks:
            durable.task(**options)(fun)
        app.extensions[EXTENSION_KEY] = durable
        self._durables.append(durable)
        return durable

    def task(self, *args: Any, **options: Any) -> Any:
        """Declare a durable task now, register it at ``init_app``: ``@ext.task(name=…)``.

        Returns a proxy to the task of the current application (inside an app context: that
        application's; otherwise Celery's default app, which ``init_app`` sets).
        """
        if len(args) == 1 and callable(args[0]) and not options:
            return self._declare(args[0], {})
        if args:
            raise TypeError("use @ext.task or @ext.task(name=..., **celery_options)")
        return lambda fun: self._declare(fun, options)

    def _declare(self, fun: Callable[..., Any], options: dict[str, Any]) -> Any:
        self._tasks.append((fun, options))
        for durable in self._durables:
            durable.task(**options)(fun)
        name: str | None = options.get("name")

        def current_task() -> Any:
            celery_app = self._current_celery()
            return celery_app.tasks[name or celery_app.gen_task_name(fun.__name__, fun.__module__)]

        return Proxy(current_task)

    def _current_celery(self) -> Celery:
        from celery import current_app
        from flask import current_app as flask_app
        from flask import has_app_context

        if has_app_context() and EXTENSION_KEY in flask_app.extensions:
            return flask_app.extensions[EXTENSION_KEY].app
        return current_app._get_current_object()

    @staticmethod
    def durable(app: Flask | None = None) -> Durable:
        """The ``Durable`` of ``app`` (default: the current Flask application)."""
        if app is None:
            from flask import current_app

            app = current_app
        try:
            found = app.extensions[EXTENSION_KEY]
        except KeyError:
            raise RuntimeError(
                "celery_durable is not initialised on this Flask app; call init_app(app)"
            ) from None
        return found
