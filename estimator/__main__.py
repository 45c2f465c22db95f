"""`python -m estimator COMMAND ...`: the `estimator` command line."""
import sys

from .cli import main

sys.exit(main())
