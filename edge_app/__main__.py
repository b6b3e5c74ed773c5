"""``python -m edge_app`` is ``edge-app``."""

from edge_app.cli import main

raise SystemExit(main())
