"""agent-2pc command line: python -m agent_2pc ..."""
import sys

from .cli.main import main

sys.exit(main())
