"""Recorded GPU results (qwen_lab.course.recorded): a measuring cell keeps what the GPU measured only when a
recording run asks for it, and shows the course's record on a CPU, labelled with where it came from."""

import ast
import json
import re
from pathlib import Path

import pytest

from qwen_lab.course import recorded

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
DATE = re.compile(r"^20\d\d-\d\d-\d\d$")


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 1.5))
    FigureCanvasAgg(fig)
    fig.subplots().plot([1, 2, 3], [3, 1, 2])
    return fig


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_keep_writes_nothing_unless_recording(tmp_path, monkeypatch):
    monkeypatch.delenv(recorded.ENV, raising=False)
    shipped = _files(recorded.RECORDS)
    monkeypatch.chdir(tmp_path)
    assert recorded.keep("03.tflops", table=[{"a": 1.0}], figure=_figure(), notes=["x"]) is None
    assert _files(tmp_path) == []
    assert _files(recorded.RECORDS) == shipped


def test_keep_show_round_trip(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(recorded.ENV, str(tmp_path))
    path = recorded.keep("03.tflops", figure=_figure(), notes=["TFLOP/s at M = 2048"],
                         table={"MLP down": {"torch.matmul": 612.345678, "qwen_lab matmul": 598.0},
                                "LM head": {"torch.matmul": 701.0, "qwen_lab matmul": None}})
    assert path == tmp_path / "03.tflops.json"
    assert (tmp_path / "03.tflops.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = recorded.load("03.tflops", folder=tmp_path)
    assert record["table"] == {"columns": ["", "torch.matmul", "qwen_lab matmul"],
                               "rows": [["MLP down", 612.3, 598.0], ["LM head", 701.0, None]]}
    assert record["notes"] == ["TFLOP/s at M = 2048"]
    assert record["command"] == recorded.command_for("03.tflops") == \
        "python benchmarks/record_notebooks.py --only 03"
    capsys.readouterr()
    assert recorded.show("03.tflops", folder=tmp_path) == record
    shown = capsys.readouterr().out
    for text in ("Recorded on", record["gpu"], record["date"], record["command"], "MLP down", "612.3", "LM head",
                 "TFLOP/s at M = 2048", "03.tflops.png"):
        assert text in shown, (text, shown)


def test_label_says_gpu_date_versions_and_command(tmp_path):
    recorded.keep("07.decode", table=[{"cached tokens": 256, "us": 10.0}], folder=tmp_path,
                  command="python benchmarks/record_notebooks.py --only 07",
                  measured={"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-12-06", "torch": "2.11.0",
                            "triton": "3.6.0", "source": "from a test"})
    line = recorded.label(recorded.load("07.decode", folder=tmp_path))
    assert line == ("Recorded on NVIDIA H100 80GB HBM3, 2026-12-06 (torch 2.11.0, triton 3.6.0). Again on a GPU: "
                    "python benchmarks/record_notebooks.py --only 07")
    with pytest.raises(ValueError, match="gpu"):
        recorded.keep("07.decode", folder=tmp_path, measured={"date": "2026-12-06"})


def test_a_missing_record_prints_one_line(tmp_path, capsys):
    assert recorded.show("12.prefill", folder=tmp_path) is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    assert "12.prefill" in lines[0] and recorded.command_for("12.prefill") in lines[0]


def test_tables_in_every_form_and_bad_input(tmp_path):
    rows = [{"T": 1, "GB/s": 10.0}, {"T": 16, "GB/s": 123.456789}]
    want = {"columns": ["T", "GB/s"], "rows": [[1, 10.0], [16, 123.5]]}
    assert recorded.as_table(rows) == want
    assert recorded.as_table((["T", "GB/s"], [[1, 10.0], [16, 123.456789]])) == want
    assert recorded.as_table(want) == want
    text = repr(recorded.Table(want))
    assert text.splitlines()[0].split() == ["T", "GB/s"] and "123.5" in text
    markdown = recorded.Table(want)._repr_markdown_()
    assert markdown.splitlines()[:2] == ["| T | GB/s |", "| --- | --- |"]
    with pytest.raises(TypeError, match="table"):
        recorded.as_table("T = 1")
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        recorded.as_table((["a", "b", "c"], [[1, 2]]))
    with pytest.raises(ValueError, match="NN.word"):
        recorded.keep("tflops", folder=tmp_path)


def _calls(node, method):
    """Names of recorded.<method>("NAME") calls under `node` (a statement or a list of them)."""
    nodes = node if isinstance(node, list) else [node]
    return [c.args[0].value for n in nodes for c in ast.walk(n)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == method
            and isinstance(c.func.value, ast.Name) and c.func.value.id == "recorded"
            and c.args and isinstance(c.args[0], ast.Constant)]


def _code_cells(path):
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            # IPython magics and shell lines are not Python
            yield i, "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_show_has_its_keep_in_the_gpu_branch(path):
    shows = keeps = 0
    for i, src in _code_cells(path):
        tree = ast.parse(src)
        kept = _calls(tree, "keep")
        for name in kept:
            assert name.startswith(path.name[:2] + "."), f"solutions/{path.name} cell {i}: record {name!r} is " \
                                                         f"named for another notebook"
        paired = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If):
                paired |= set(_calls(node.body, "keep")) & set(_calls(node.orelse, "show"))
        for name in _calls(tree, "show"):
            assert name in paired, (f"solutions/{path.name} cell {i}: recorded.show({name!r}) has no "
                                    f"recorded.keep({name!r}) in the branch that measures")
        shows, keeps = shows + len(_calls(tree, "show")), keeps + len(kept)
    assert shows >= 1 and shows == keeps, f"solutions/{path.name}: {shows} shows, {keeps} keeps"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_no_cell_just_skips_on_a_cpu(path):
    for i, src in _code_cells(path):
        assert "skipped on CPU" not in src, (f"solutions/{path.name} cell {i}: a GPU cell that shows nothing on a "
                                             f"CPU; keep its result on the GPU and show the record on a CPU")


def test_record_names_are_unique_across_the_course():
    names = [n for path in SOLUTIONS for _, src in _code_cells(path) for n in _calls(ast.parse(src), "keep")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_every_shipped_record_is_labelled_and_kept_by_a_notebook():
    kept = {n for path in SOLUTIONS for _, src in _code_cells(path) for n in _calls(ast.parse(src), "keep")}
    names = recorded.names()
    assert names, f"no records in {recorded.RECORDS}"
    for name in names:
        record = recorded.load(name)
        assert record["name"] == name
        for key in recorded.LABEL_KEYS:
            assert isinstance(record.get(key), str) and record[key].strip(), f"records/{name}.json: no {key!r}"
        assert DATE.match(record["date"]), f"records/{name}.json: date {record['date']!r} is not YYYY-MM-DD"
        assert record["gpu"] != "cpu", f"records/{name}.json: recorded without a GPU"
        assert name in kept, f"records/{name}.json: no notebook keeps or shows it"
        assert record["table"]["columns"] or record.get("figure") or record.get("notes"), \
            f"records/{name}.json: nothing to show"
        if record.get("figure"):
            assert (recorded.RECORDS / record["figure"]).is_file(), f"records/{name}.json: its figure is missing"
    pngs = {p.stem for p in recorded.RECORDS.glob("*.png")}
    assert pngs <= set(names), f"figures without a record: {sorted(pngs - set(names))}"


def test_records_ship_as_package_data():
    assert '"course/records/*"' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_records_made_from_a_saved_result_are_what_that_result_gives(tmp_path):
    """benchmarks/record_notebooks.py --bench-json makes notebook 13's two benchmark records from a saved benchmark
    JSON (docs/results/): labelled with that run's GPU, date and file, each number the file's, rounded as records
    round; nothing typed in by hand."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("record_notebooks", ROOT / "benchmarks" / "record_notebooks.py")
    record_notebooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record_notebooks)
    def is_bench(p: Path) -> bool:   # qwen_lab.bench's results (not the persistent step's own benchmarks)
        r = json.loads(p.read_text(encoding="utf-8"))
        return {"rows", "floors", "gpu", "date"} <= set(r) and all("prefill_ms" in row for row in r["rows"])

    saved = [p for p in sorted((ROOT / "docs" / "results").glob("*.json")) if is_bench(p)]
    assert saved, "docs/results/ holds no benchmark result (python -m qwen_lab.bench --json)"
    for source in saved:
        result = json.loads(source.read_text(encoding="utf-8"))
        folder = tmp_path / source.stem
        assert record_notebooks.bench_records(source, folder) == ["13.bench", "13.compare"]
        bench_rec, compare = (recorded.load(n, folder=folder) for n in ("13.bench", "13.compare"))
        for r in (bench_rec, compare):
            assert r["gpu"] == result["gpu"] and r["date"] == str(result["date"])[:10], r
            assert r["source"] == f"from docs/results/{source.name}", r
        by_name = {row["name"]: row for row in result["rows"]}
        columns = bench_rec["table"]["columns"]
        assert [row[0] for row in bench_rec["table"]["rows"]] == list(by_name)
        for row in bench_rec["table"]["rows"]:
            for column, value in zip(columns[1:], row[1:]):
                want = by_name[row[0]].get(column)
                assert (value is None) == (want is None) and (want is None or value == pytest.approx(want, rel=1e-3)), (
                    f"{source.name}: 13.bench {row[0]} {column}: {value} against the file's {want}")
        for name, prefill, decode in compare["table"]["rows"]:
            want = result["floors"] if name == "floor" else by_name[name]
            assert (prefill, decode) == (pytest.approx(want["prefill_ms"], rel=1e-3),
                                         pytest.approx(want["decode_ms"], rel=1e-3)), (source.name, name)
