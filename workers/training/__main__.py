"""`python -m workers.training --data CSV ...`: the same as `tierflow train`."""

import sys

from workers.training.run import main

sys.exit(main())
