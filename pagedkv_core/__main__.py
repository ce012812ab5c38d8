"""``python -m pagedkv_core ...``: see :mod:`pagedkv_core.cli`."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
