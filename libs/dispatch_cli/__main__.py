"""``python -m dispatch_cli``: the same as the ``dispatch`` command."""

import sys

from dispatch_cli.main import main

sys.exit(main())
