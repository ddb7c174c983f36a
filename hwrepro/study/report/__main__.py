"""`python -m hwrepro.study.report`: see hwrepro.study.report.main."""

import sys

from hwrepro.study.report import main

sys.exit(main())
