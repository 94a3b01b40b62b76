"""Framework integrations: ``contrib.django`` (an installed app) and ``contrib.flask``.

Nothing here is imported by the core package; each integration imports its framework only
when it is itself imported.
"""
