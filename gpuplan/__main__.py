"""python -m gpuplan"""

import sys

from gpuplan.cli.main import main

sys.exit(main())
