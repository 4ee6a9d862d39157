"""``python -m crowdgrad``: the command line, as the ``crowdgrad`` script runs it."""

from crowdgrad.cli import main

raise SystemExit(main())
