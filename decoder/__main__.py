"""`python -m decoder`: the command line of decoder/cli.py."""

from decoder.cli import main

raise SystemExit(main())
