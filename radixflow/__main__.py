"""`python -m radixflow ...` is the `radixflow` command line."""

import sys

from radixflow.runtime.cli import main

sys.exit(main())
