"""`python -m hfbert`: the `hfbert` command."""

import sys

from hfbert.cli import main

if __name__ == "__main__":
    sys.exit(main())
