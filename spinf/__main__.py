"""``python -m spinf`` is the ``spinf-serve`` command."""

from spinf.cli import main

raise SystemExit(main())
