"""Issue 49's bar for the CPU default model: `python -m qwen_lab.generate --max-new-tokens 32` writes English.

    python scripts/english_bar.py                 # every prompt greedy and at T 0.8 / top-p 0.9 over 3 seeds
    python scripts/english_bar.py --quick         # the default prompt, greedy and one sampled run

Each run is the real command line (a subprocess, the Triton interpreter on a CPU), timed from start to exit. A run
passes when its continuation (the text after the prompt)
- has at least MIN_WORDS words, and at least 85% of them are English words: in Debian's word list wamerican
  (/usr/share/dict/words; `apt-get install wamerican`), compared as written or in lower case;
- is not a loop: no run of 3 words occurs more than MAX_REPEATS times;
- took under 60 s.
Prints one line a run and a summary; exits 1 if any run fails.
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

WORDS_FILE = Path("/usr/share/dict/words")
MIN_ENGLISH, MIN_WORDS, MAX_REPEATS, MAX_SECONDS = 0.85, 8, 3, 60.0
DEFAULT_PROMPT = None  # the command line's own default
PROMPTS = (DEFAULT_PROMPT, "It is a truth universally acknowledged, that", "She walked into the garden and",
           "The letter was short, but")
SEEDS = (0, 1, 2)
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


def english_words() -> set[str]:
    if not WORDS_FILE.is_file():
        raise FileNotFoundError(f"{WORDS_FILE}: no word list; install Debian's wamerican (apt-get install wamerican)")
    return {w.strip() for w in WORDS_FILE.read_text(encoding="utf-8", errors="replace").splitlines() if w.strip()}


def judge(text: str, words: set[str]) -> dict:
    """The bar's measures of a continuation: its words, the English share, the most repeated 3-word run."""
    found = _WORD.findall(text)
    english = [w for w in found if w in words or w.lower() in words]
    grams = Counter(tuple(w.lower() for w in found[i:i + 3]) for i in range(len(found) - 2))
    top = grams.most_common(1)[0] if grams else (("",), 0)
    share = len(english) / len(found) if found else 0.0
    problems = []
    if len(found) < MIN_WORDS:
        problems.append(f"{len(found)} words, expected at least {MIN_WORDS}")
    if share < MIN_ENGLISH:
        problems.append(f"{share:.0%} English words, expected at least {MIN_ENGLISH:.0%} (not: "
                        f"{sorted(set(found) - set(english))[:8]})")
    if top[1] > MAX_REPEATS:
        problems.append(f"'{' '.join(top[0])}' {top[1]} times: a loop (at most {MAX_REPEATS})")
    return {"words": len(found), "english": share, "top_repeat": top[1], "problems": problems}


def run_cli(prompt: str | None, temperature: float = 0.0, seed: int = 0, top_p: float = 1.0,
            max_new_tokens: int = 32) -> tuple[str, str, float, float]:
    """(prompt, continuation, seconds, cpu seconds) of one `python -m qwen_lab.generate` run on the default model.
    The cpu seconds (the command's user + system time) are what it takes on a quiet machine: on a busy one (a test
    run with a worker per core) the wall time also counts the time it waited for a core."""
    args = [sys.executable, "-m", "qwen_lab.generate", "--max-new-tokens", str(max_new_tokens)]
    if prompt is not None:
        args += ["--prompt", prompt]
    if temperature:
        args += ["--temperature", str(temperature), "--top-p", str(top_p), "--seed", str(seed)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args[1:])}: exit {r.returncode}\n{r.stderr}")
    if prompt is None:
        from qwen_lab.generation import _parser

        prompt = _parser().get_default("prompt")
    if not r.stdout.startswith(prompt):
        raise RuntimeError(f"the output does not start with the prompt {prompt!r}: {r.stdout!r}")
    return prompt, r.stdout[len(prompt):].rstrip("\n"), seconds, cpu


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/english_bar.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the default prompt only: greedy and seed 0")
    args = p.parse_args(argv)
    words = english_words()
    runs = [(None, 0.0, 0), (None, 0.8, 0)] if args.quick else [
        (prompt, t, s) for prompt in PROMPTS for t, s in [(0.0, 0)] + [(0.8, s) for s in SEEDS]]
    failed = 0
    for prompt, temperature, seed in runs:
        shown, text, seconds, _ = run_cli(prompt, temperature, seed, 0.9 if temperature else 1.0)
        verdict = judge(text, words)
        if seconds >= MAX_SECONDS:
            verdict["problems"].append(f"{seconds:.0f} s, expected under {MAX_SECONDS:.0f}")
        failed += bool(verdict["problems"])
        how = "greedy" if not temperature else f"T {temperature} top-p 0.9 seed {seed}"
        print(f"{'FAIL' if verdict['problems'] else 'ok  '} {seconds:5.1f} s  {verdict['english']:4.0%} English  "
              f"{how:24s} {shown!r} -> {text!r}" + "".join(f"\n      {x}" for x in verdict["problems"]), flush=True)
    print(f"{len(runs) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
