"""python -m gpuplan.cli"""

import sys

from gpuplan.cli.main import main

sys.exit(main())
