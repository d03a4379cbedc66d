import sys

from demo.slurm.commands import main

sys.exit(main())
