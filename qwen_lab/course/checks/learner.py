"""Whose code a frame or a kernel is: the learner's (a notebook cell, a script, a test) or a library's (qwen_lab's own
files, Python's, anything installed). The checks guard the learner's allocations, watch the learner's loads and read
the learner's kernels only.
"""

from __future__ import annotations

import os

# qwen_lab's own files and Python's standard library (site-packages lies below it too). This file lies in
# qwen_lab/course/checks/: the package is two folders up.
_QWEN_LAB_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIBRARY_DIRS = tuple(os.path.join(d, "") for d in {_QWEN_LAB_DIR, os.path.dirname(os.path.abspath(os.__file__))})

def _learner_code(filename: str) -> bool:
    """Whether a frame's file is the learner's (a notebook cell, a script, a test), not a library's."""
    if filename.startswith("<frozen") or "site-packages" in filename or "dist-packages" in filename:
        return False
    if filename.startswith("<"):  # a notebook cell, or code given to exec
        return True
    return not os.path.abspath(filename).startswith(_LIBRARY_DIRS)
