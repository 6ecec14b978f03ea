import sys

from parascale.cli.main import main

sys.exit(main())
