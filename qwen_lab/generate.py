"""`python -m qwen_lab.generate`: the command line of qwen_lab.generation (the function is `qwen_lab.generate`)."""

import sys

from qwen_lab.generation import main

if __name__ == "__main__":
    sys.exit(main())
