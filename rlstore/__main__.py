import sys

from rlstore.cli import main

sys.exit(main())
