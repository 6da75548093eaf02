"""What a notebook shows in JupyterLab, checked without a browser: the cells run in a Jupyter kernel (nbclient) and
their outputs are read as JupyterLab would render them.

- Notebook 13's benchmark table is a markdown table JupyterLab draws (text/markdown), with the same text as the
  plain-text fallback, never raw pipes printed to the stream.
- Notebook 11's sliders show their whole labels ("temperature", not "temperat...").

tests/test_browser.py opens the notebooks in a real browser; these run wherever Jupyter does.
"""

import json
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat (requirements.txt)")
nbclient = pytest.importorskip("nbclient", reason="the notebook tests need nbclient (requirements.txt)")
mistune = pytest.importorskip("mistune", reason="renders markdown as Jupyter does (nbconvert's dependency)")

REPO = Path(__file__).resolve().parents[1]


def _cell(notebook: str, needle: str) -> str:
    """The source of the one code cell of solutions/`notebook` that contains `needle`."""
    nb = nbformat.read(str(REPO / "solutions" / notebook), as_version=4)
    found = [c.source for c in nb.cells if c.cell_type == "code" and needle in c.source]
    assert len(found) == 1, f"solutions/{notebook}: {len(found)} code cells contain {needle!r}; expected one"
    return found[0]


def _run(sources: list[str]):
    """Run the cells in a fresh Python kernel from the repository's root; the executed notebook."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", startup_timeout=300,
                            resources={"metadata": {"path": str(REPO)}}).execute()
    return nb


def test_notebook_13_benchmark_table_renders_as_a_table():
    table_cell = _cell("13_generation_and_benchmark.ipynb", "bench.format_table(")
    nb = _run(["import torch\nfrom qwen_lab import bench\non_gpu = False   # as the notebook decides on a CPU",
               table_cell])
    outputs = nb.cells[1].outputs
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "| row |" not in printed and "| --- |" not in printed, f"the table is printed as raw pipes:\n{printed}"
    shown = [o for o in outputs if o.output_type in ("display_data", "execute_result")
             and "text/markdown" in o.get("data", {})]
    # this run's table (the interpreter's), then on a CPU the recorded GPU table (qwen_lab.course.recorded)
    ours = [o for o in shown if "(Triton interpreter)" in o.data["text/markdown"]]
    assert len(ours) == 1, outputs
    markdown = ours[0].data["text/markdown"]
    assert "| row |" in markdown and "| triton |" in markdown, markdown
    # JupyterLab renders text/markdown: the pipes become a table with a header and the triton row
    html = mistune.create_markdown(plugins=["table"])(markdown)
    assert "<table>" in html and re.search(r"<th[^>]*>\s*row\s*</th>", html), html
    assert re.search(r"<td[^>]*>\s*triton\s*</td>", html), html
    # a text-only front end (a terminal, nbval) gets the same table as text
    assert ours[0].data["text/plain"] == markdown


def test_notebook_11_sliders_show_their_whole_labels():
    widget_cell = _cell("11_decode_and_sampling.ipynb", "widgets.interact(")
    nb = _run(["import torch\nimport matplotlib.pyplot as plt\n%matplotlib inline", widget_cell])
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    sliders = {m["state"]["description"]: m["state"] for m in state.values()
               if m["model_name"] in ("FloatSliderModel", "IntSliderModel")}
    assert set(sliders) == {"temperature", "top_k", "top_p"}, json.dumps(state)[:2000]
    for name, slider in sliders.items():
        style = state[slider["style"].removeprefix("IPY_MODEL_")]["state"]
        # the default width (a fixed few characters) cuts "temperature" to "temperat..."; "initial" fits the label
        assert style["description_width"] == "initial", (name, style)
    # the plot, drawn once with the default values, is in the interact's output area (an Output widget)
    drawn = [o for m in state.values() if m["model_name"] == "OutputModel" for o in m["state"].get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in drawn), drawn
