"""`python -m vitmix` = the `vitmix` command."""
import sys

from .cli import main

sys.exit(main())
