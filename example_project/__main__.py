"""``python -m example_project`` (see :mod:`example_project.main`)."""

from example_project.main import main

raise SystemExit(main())
