"""`python -m tirl.cli ...` (and `torchrun -m tirl.cli ...`): the `tirl` command."""

import sys

from tirl.cli import main

sys.exit(main())
