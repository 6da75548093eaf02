"""`python -m qwen_lab.exercises build|check|list|nbgrader`, the command the course's spec names: it runs the course's
command line (qwen_lab.course.exercises) and holds nothing else. Import the tool itself from qwen_lab.course.
"""

import sys

from .course.exercises import main

if __name__ == "__main__":
    sys.exit(main())
