import sys

from vjob.cli import main

sys.exit(main())
