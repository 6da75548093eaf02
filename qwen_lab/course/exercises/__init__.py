"""Build the learner's notebooks/ from the instructor's solutions/, and check that they are in sync.

    python -m qwen_lab.exercises build [--solutions DIR] [--notebooks DIR]
    python -m qwen_lab.exercises check [--solutions DIR] [--notebooks DIR]
    python -m qwen_lab.exercises list  [--solutions DIR]
    python -m qwen_lab.exercises nbgrader --out COURSE_DIR [--solutions DIR]

`solutions/NN_name.ipynb` is the complete notebook and the only one anybody edits. `build` writes
`notebooks/NN_name.ipynb` from it:

- In a code cell, every block between a line `### BEGIN SOLUTION` and a line `### END SOLUTION`
  (the nbgrader convention) becomes one line `raise NotImplementedError("<title>")` at the
  indentation of the BEGIN marker. The title is the cell's first line without its `# `, e.g.
  `# Exercise 02.1: zero-centred RMSNorm` gives "Exercise 02.1: zero-centred RMSNorm".
- In a markdown cell (a written answer) the markers are HTML comments, `<!-- BEGIN SOLUTION -->` and
  `<!-- END SOLUTION -->`, which Jupyter renders as nothing (`### BEGIN SOLUTION` would show as a
  heading, and is refused there); the block becomes `*Your answer here.*`.
- A cell tagged `check` (it grades an exercise, or needs one finished) also gets the tag
  `raises-exception`, so nbval and nbclient expect it to fail in the learner's version.
- Outputs, execution counts and run metadata are dropped; cell ids are kept (cells without one get
  an id derived from their position), so building twice gives byte-identical files.
- The instructor's editor state is dropped: cell metadata `editable`, `deletable`, `jupyter` (hidden
  source or outputs), `nbgrader`, `vscode`, `colab`; the notebook metadata becomes the default kernel
  `{"name": "python3", "display_name": "Python 3", "language": "python"}` with language_info
  `{"name": "python"}` (only `title` and `authors` are kept besides), so a learner's notebook opens on
  Colab or a fresh machine whatever kernel the solution was last run with. Cell tags are kept.
- Notebooks without exercises are copied with outputs cleared. A `notebooks/*.ipynb` file without a
  solution is removed only when build wrote it: named like a solution (`NN_name.ipynb`) and in the
  form build writes (the learner's notebook metadata above and nothing else, no outputs, execution
  counts or editor metadata, check cells tagged `raises-exception`; see `is_generated_notebook`). Any
  other file there (`my_analysis.ipynb`, a notebook somebody ran) is left alone, with a note.
- With only `--solutions DIR`, the notebooks go to `notebooks/` beside DIR. With neither option, both
  folders are those of the current directory when it holds `solutions/`, else of the checkout the
  package is imported from (the output line says which). `build` refuses a `--notebooks` folder that
  is the solutions folder or inside it, before writing anything.

Before writing anything, `build` validates every solution and stops on any problem, naming the
notebook and the cell (cells counted from 0, as in `nb.cells[i]`): unmatched or nested markers, a
line that looks like a marker but is not exactly one (in any case, '#' then BEGIN or END then a word
starting with SOLUT, anywhere in a line of code or as the whole of a line of markdown: `### BEGIN
SOLUTON`, `### END SOLUTIONS`, `x = 0  ### BEGIN SOLUTION`, in markdown also such a line inside an
HTML comment, `<!--BEGIN SOLUTION-->`; named by its line), the code cells' markers in a markdown cell
(they would render as headings), a code cell titled
`# Exercise ...` without a solution block (it would reach the learner whole), markers in a cell whose first line is no
`# Exercise` title, a stub that would run as soon as its cell runs (not inside a function body), an
exercise notebook without a `check` cell, a check cell before the exercise it grades, and a cell without the
`check` tag that would stop the learner's notebook: it runs an exercise's function (directly, or through a
function a later cell builds on it, outside a `try` that catches NotImplementedError) or reads a name that only
a check cell binds.

`check` builds in memory and compares byte for byte with what is in notebooks/: it exits 1 listing
every missing, differing or stale file, and 0 when they are in sync.

`nbgrader` writes an nbgrader course directory for instructors who grade with nbgrader: every solution as
`COURSE_DIR/source/NN_name/NN_name.ipynb` (one assignment per chapter, the markers left for nbgrader to strip)
with nbgrader's cell metadata added, and a `nbgrader_config.py` beside it. An exercise's code cell becomes a
solution cell; each check cell an autograded test cell worth one point (it passes when it runs without an
error, which is how every check reports), locked so a learner cannot edit it; a written answer (markdown) a
manually graded answer worth one point. Then `nbgrader generate_assignment NN_name` in COURSE_DIR makes the
learners' version, and `nbgrader autograde` grades what they hand in.

In Python: `strip_solutions(nb)` returns the learner's version of a notebook, `list_exercises(path)`
the (title, cell index) of its exercises, `exercise_and_check(path, title)` the cells that grade one of them,
`validate(nb, name)` the list of problems,
`nbgrader_notebook(nb)` the nbgrader source version, `build()`, `check()` and `export_nbgrader()` what the
commands do, `resolve_dirs()` their default folders, `is_generated_notebook(path)` whether build may remove a file.

The modules: cells.py (the markers, tags, titles and stubs of one cell), files.py (reading and writing notebooks),
validation.py (the rules, and the exercises of a notebook), building.py (the learner's version, build and check),
nbgrader.py (the nbgrader export), cli.py (the command line).
"""

from .building import (RECORD, EditedNotebooks, Report, build, build_notebook, check, default_root,
                       edited_since_built, is_generated_notebook, resolve_dirs, strip_solutions)
from .cells import (BEGIN, CHECK_TAG, DEFAULT_TITLE, END, LEARNER_KERNELSPEC, LEARNER_LANGUAGE_INFO, MARKDOWN_STUB,
                    MD_BEGIN, MD_END, RAISES_TAG, REBUILD, ExerciseError, cell_title, stub_line)
from .cli import main
from .files import dumps
from .nbgrader import NBGRADER_CONFIG, NBGRADER_SCHEMA, NBGRADER_STUB, export_nbgrader, nbgrader_notebook
from .validation import exercise_and_check, list_exercises, validate

__all__ = ["RECORD", "EditedNotebooks", "edited_since_built",
           "BEGIN", "CHECK_TAG", "DEFAULT_TITLE", "END", "LEARNER_KERNELSPEC", "LEARNER_LANGUAGE_INFO", "MARKDOWN_STUB",
           "MD_BEGIN", "MD_END", "NBGRADER_CONFIG", "NBGRADER_SCHEMA", "NBGRADER_STUB", "RAISES_TAG", "REBUILD", "ExerciseError", "Report",
           "build", "build_notebook", "cell_title", "check", "default_root", "dumps", "exercise_and_check",
           "export_nbgrader", "is_generated_notebook", "list_exercises", "main", "nbgrader_notebook", "resolve_dirs",
           "strip_solutions", "stub_line", "validate"]
