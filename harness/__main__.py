import sys

from harness.cli.main import main

sys.exit(main())
