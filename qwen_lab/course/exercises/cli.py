"""The command line: `python -m qwen_lab.exercises build|check|list|nbgrader` (also `python -m qwen_lab.course ...`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .building import EditedNotebooks, Report, _default_root_note, build, check, default_root, resolve_dirs
from .cells import ExerciseError
from .files import _display
from .nbgrader import export_nbgrader
from .validation import list_exercises

def _print_problems(e: ExerciseError, solutions: Path, notebooks: Path | None = None) -> int:
    where = notebooks if isinstance(e, EditedNotebooks) and notebooks is not None else solutions
    print(f"nothing written: {len(e.problems)} problem(s) in {_display(where)}/", file=sys.stderr)
    for p in e.problems:
        print(f"  {p}", file=sys.stderr)
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen_lab.exercises",
                                     description="Build the learner's notebooks/ from solutions/, or check they "
                                                 "are in sync.")
    dirs = argparse.ArgumentParser(add_help=False)
    dirs.add_argument("--solutions", type=Path, default=None, metavar="DIR",
                      help="the solution notebooks (default: solutions/ of the current directory when it has one, "
                           "else of the checkout qwen_lab is imported from)")
    dirs.add_argument("--notebooks", type=Path, default=None, metavar="DIR",
                      help="where the learner's notebooks go (default: notebooks/ beside --solutions DIR when that "
                           "is given, else notebooks/ of the same checkout as the default solutions/)")
    sub = parser.add_subparsers(dest="command", required=True)
    builder = sub.add_parser("build", parents=[dirs], help="write notebooks/ from solutions/")
    builder.add_argument("--force", action="store_true",
                         help="overwrite notebooks edited since build last wrote them, keeping a copy of each as "
                              "NAME.ipynb.bak")
    sub.add_parser("check", parents=[dirs], help="exit 1 unless notebooks/ is what solutions/ builds")
    sub.add_parser("list", parents=[dirs], help="list every exercise of every solution notebook")
    grader = sub.add_parser("nbgrader", help="write an nbgrader course directory (source/ and nbgrader_config.py)")
    grader.add_argument("--solutions", type=Path, default=None, metavar="DIR",
                        help="the solution notebooks (default: solutions/ of the current directory when it has "
                             "one, else of the checkout qwen_lab is imported from)")
    grader.add_argument("--out", type=Path, required=True, metavar="COURSE_DIR",
                        help="the nbgrader course directory to write (created if missing; its source/ notebooks "
                             "and nbgrader_config.py are overwritten)")
    args = parser.parse_args(argv)

    root = default_root()
    solutions = args.solutions if args.solutions is not None else root / "solutions"
    # which checkout the default folders come from, named on the output line
    defaults = "" if args.solutions is not None else f"; default folders from {_default_root_note(root)}"
    if args.command == "nbgrader":
        try:
            report = export_nbgrader(args.out, solutions)
        except ExerciseError as e:
            return _print_problems(e, solutions)
        print(f"wrote {len(report.written)} files: {report.notebooks} assignments under {_display(args.out)}/source/ "
              f"({report.exercises} exercises) and {_display(args.out / 'nbgrader_config.py')}")
        print(f"then, in {_display(args.out)}: nbgrader generate_assignment NN_name (one per chapter)")
        return 0
    solutions, notebooks = resolve_dirs(args.solutions, args.notebooks)
    where = f"{_display(notebooks)}/ in sync with {_display(solutions)}/"

    if args.command == "list":
        if not solutions.is_dir():
            print(f"{_display(solutions)}/: no such directory (pass --solutions DIR)", file=sys.stderr)
            return 1
        for path in sorted(solutions.glob("*.ipynb")):
            try:
                exercises = list_exercises(path)
            except ExerciseError as e:
                print(e, file=sys.stderr)
                return 1
            print(f"{_display(path)}: {len(exercises)} exercise(s)")
            for title, index in exercises:
                print(f"  cell {index:3d}  {title}")
        return 0

    if args.command == "build":
        try:
            report = build(solutions, notebooks, force=args.force)
        except ExerciseError as e:
            return _print_problems(e, solutions, notebooks)
        for path in report.backed_up:
            print(f"kept the edited notebook as {path}")
        for path in report.written:
            print(f"wrote {path}")
        for path in report.removed:
            print(f"removed {path} (no solution)")
        _print_kept(report)
        print(f"{_display(notebooks)}/ built from {_display(solutions)}/ ({report.notebooks} notebooks, "
              f"{report.exercises} exercises; {len(report.written)} written, {len(report.removed)} removed)"
              f"{defaults}")
        return 0

    report = check(solutions, notebooks)
    if not report.ok:
        for p in report.problems:
            print(p, file=sys.stderr)
        return 1
    _print_kept(report)
    print(f"{where} ({report.notebooks} notebooks, {report.exercises} exercises){defaults}")
    return 0


def _print_kept(report: Report) -> None:
    for path in report.kept:
        print(f"left {path} alone: it has no solution, and build did not write it")


if __name__ == "__main__":
    sys.exit(main())
