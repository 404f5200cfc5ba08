"""``python -m sgd.cli``: the ``sgd`` command, as before ``sgd.cli`` became a package."""

import sys

from sgd.cli.main import main

sys.exit(main())
