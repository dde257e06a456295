"""``python -m sagemaker_dist.cli``: the same as the ``sagemaker-dist`` console command."""

import sys

from sagemaker_dist.cli import main

sys.exit(main())
