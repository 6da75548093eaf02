"""The engine never imports the course: qwen_lab.course (checks, exercises, syncguard, setup) grades and builds the
notebooks; everything else in qwen_lab/ runs the model and must work without it."""

import ast
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "qwen_lab")
COURSE = os.path.join(PACKAGE, "course")
# `python -m qwen_lab.exercises ...` is the command the course's spec names: this file only runs the course's command
# line, and is no part of the engine
COMMAND = os.path.join(PACKAGE, "exercises.py")

# Imports the named engine modules and every other module of qwen_lab (kernel families' folders included) outside
# qwen_lab.course and the command above, then prints the qwen_lab modules loaded.
PROGRAM = r"""
import importlib, json, os, pkgutil, sys
import qwen_lab
named = ["qwen_lab.model", "qwen_lab.generate", "qwen_lab.graph", "qwen_lab.bench", "qwen_lab.weights",
         "qwen_lab.tokenizer", "qwen_lab.kernels"]
for name in named:
    importlib.import_module(name)
def walk(folder, prefix):   # (pkgutil.walk_packages would import every package to look inside, the course's too)
    for m in pkgutil.iter_modules([folder], prefix):
        if m.name in ("qwen_lab.course", "qwen_lab.exercises") or m.name.endswith(".__main__"):
            continue
        yield m.name
        if m.ispkg:
            yield from walk(os.path.join(folder, m.name.rsplit(".", 1)[-1]), m.name + ".")
found = list(walk(qwen_lab.__path__[0], "qwen_lab."))
for name in found:
    importlib.import_module(name)
print(json.dumps({"imported": named + found, "loaded": sorted(m for m in sys.modules if m.startswith("qwen_lab"))}))
"""


def test_importing_every_engine_module_imports_no_course_module():
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    kernels = [m for m in result["imported"] if m.startswith("qwen_lab.kernels.")]
    assert kernels, "no module of qwen_lab.kernels was found to import"
    course = [m for m in result["loaded"] if m == "qwen_lab.course" or m.startswith("qwen_lab.course.")]
    assert not course, f"importing the engine imported the course: {course}"


# `qwen_lab.course`, or a relative import of the course from a module of the engine
NAMES_THE_COURSE = re.compile(r"qwen_lab\.course\b|from\s+\.+\s*course\b|from\s+\.+\s+import\s+[^\n]*\bcourse\b")


def test_no_engine_file_names_the_course():
    named = []
    for folder, dirs, files in os.walk(PACKAGE):
        if os.path.abspath(folder) == COURSE:
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if os.path.join(folder, d) != COURSE]
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and path != COMMAND:
                with open(path, encoding="utf-8") as f:
                    if NAMES_THE_COURSE.search(f.read()):
                        named.append(os.path.relpath(path, ROOT))
    assert not named, f"engine files that name qwen_lab.course: {named}"


def test_the_exercises_command_only_runs_the_course():
    """qwen_lab/exercises.py defines nothing: the tool itself lives in qwen_lab.course.exercises."""
    with open(COMMAND, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    defined = [node.name for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert not defined, f"qwen_lab/exercises.py defines {defined}"
    assert NAMES_THE_COURSE.search(ast.unparse(tree))   # (and so the test above must leave it out)
