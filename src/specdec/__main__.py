"""``python -m specdec``: the same command as the ``specdec`` script."""

import sys

from specdec.cli import main

if __name__ == "__main__":
    sys.exit(main())
