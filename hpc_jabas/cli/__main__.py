"""`python -m hpc_jabas.cli` runs the `hpc-jabas` command."""
import sys

from hpc_jabas.cli.main import main

sys.exit(main())
