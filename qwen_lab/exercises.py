"""`python -m qwen_lab.exercises build|check|list|nbgrader`, the command the course's spec names: it runs the course's
command line (qwen_lab.course.exercises) and holds nothing else. Import the tool itself from qwen_lab.course.
"""

import sys

# exercise_and_check: for benchmarks/probe_check_retry.py, which still imports it from here (to go once it imports
# qwen_lab.course.exercises)
from .course.exercises import exercise_and_check, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
