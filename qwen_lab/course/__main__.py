"""`python -m qwen_lab.course build|check|list|nbgrader`: the course's command line (exercises/cli.py)."""

import sys

from .exercises.cli import main

if __name__ == "__main__":
    sys.exit(main())
