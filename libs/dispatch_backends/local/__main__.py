"""``python -m dispatch_backends.local`` (see :mod:`dispatch_backends.local.cli`)."""

import sys

from dispatch_backends.local.cli import main

sys.exit(main())
