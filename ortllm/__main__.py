import sys

from ortllm.cli import main

sys.exit(main())
