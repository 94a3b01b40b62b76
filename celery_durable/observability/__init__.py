"""Watching the library at work: what a project subscribes to, scrapes and probes (O3, O4).

``signals`` holds the Celery signals the dispatcher and the schedule API send; ``metrics``
feeds Prometheus from them (extra ``prometheus``); ``health`` answers whether a dispatcher is
alive and keeping up, the facts behind ``celery durable health`` and the health gauges. The
three sit in different layers (``tools/import_graph.py``): ``signals`` low, so that the
dispatcher can send them; ``metrics`` at the top, beside the facade it may be handed. This
``__init__`` loads nothing.
"""
