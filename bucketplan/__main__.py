"""``python -m bucketplan``: the command line, as the ``bucketplan`` script runs it."""

import sys

from bucketplan.cli import main

if __name__ == "__main__":
    sys.exit(main())
