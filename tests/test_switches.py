"""qwen_lab.switches: every switch of the engine in one place, read at each call; one way to force a kernel's config."""

import ast
import pathlib

import pytest

from qwen_lab import ConfigError, tunings
from qwen_lab.switches import SWITCHES, switches

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_a_switch_reads_its_variable_at_each_call_and_set_wins_for_its_block(monkeypatch):
    monkeypatch.delenv("QWEN_LAB_DETERMINISTIC", raising=False)
    assert switches.deterministic is False
    monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", "yes")
    assert switches.deterministic is True
    with switches.set(deterministic=False, scan_group=2):
        assert switches.deterministic is False and switches.scan_group == 2
        with switches.set(scan_group=4):
            assert switches.scan_group == 4
        assert switches.scan_group == 2
    assert switches.deterministic is True and switches.scan_group == SWITCHES["scan_group"].default
    monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", "0")
    assert switches.deterministic is False


def test_bad_names_and_assignments_are_refused_naming_them():
    with pytest.raises(AttributeError, match=r"switches.no_such: no such switch; expected one of deterministic"):
        switches.no_such
    with pytest.raises(ConfigError, match=r"switches.set\(pdll=...\): no such switch"):
        with switches.set(pdll=False):
            pass
    with pytest.raises(ConfigError, match=r"switches.pdl = False: set switches with `with switches.set\(pdl=...\)`"):
        switches.pdl = False
    with pytest.raises(ConfigError, match="force_config: kernel=3"):
        with switches.force_config(3, None):
            pass


def test_a_forced_config_holds_for_its_block_and_nests():
    assert switches.forced("chunk_scan_kernel") is None
    with switches.force_config("chunk_scan_kernel", "a"):
        with switches.force_config("chunk_scan_kernel", "b"):
            assert switches.forced("chunk_scan_kernel") == "b"
        assert switches.forced("chunk_scan_kernel") == "a"
    assert switches.forced("chunk_scan_kernel") is None


def test_a_switch_set_in_code_keeps_its_tuning_picks_apart(monkeypatch):
    """A pick timed under a switch set in code is filed under it, as one set in the environment is."""
    monkeypatch.setattr(tunings, "_device_identity", lambda device: ("Test GPU", "sm_90"))
    plain = tunings.path("cuda")
    with switches.set(prep_persistent=False):
        assert tunings.path("cuda") != plain
    assert tunings.path("cuda") == plain


def _reads_the_environment(tree) -> list:
    """Lines that read os.environ / os.getenv with a QWEN_LAB_ name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("QWEN_LAB_"):
            found.append((node.lineno, node.value))
    return found


def test_the_engine_reads_its_switches_in_one_place():
    """No module of the engine but switches.py names a QWEN_LAB_ switch variable (tunings.py names its own cache
    switch's variable in messages and files its picks by the environment; the notebooks' model and source are the
    course's)."""
    allowed = {"switches.py", "tunings.py"}
    offenders = []
    for path in sorted((ROOT / "qwen_lab").rglob("*.py")):
        if path.name in allowed or "course" in path.parts:
            continue
        for line, name in _reads_the_environment(ast.parse(path.read_text())):
            if name in {s.env for s in SWITCHES.values()}:
                offenders.append(f"{path.relative_to(ROOT)}:{line} {name}")
    assert not offenders, offenders


def test_the_readme_names_every_environment_switch():
    readme = (ROOT / "README.md").read_text()
    missing = [s.env for s in SWITCHES.values() if s.env is not None and f"`{s.env}=" not in readme]
    assert not missing, f"README.md does not name {missing}"
    documented = (ROOT / "qwen_lab" / "switches.py").read_text()
    assert all(f"| {name} |" in documented for name in SWITCHES), "every switch has a row in switches.py's table"


def test_the_environment_variables_keep_their_meaning_for_the_kernels(monkeypatch):
    """What scripts and the README set keeps working: the GEMV's deterministic mode, the tuning and PDL switches
    read through the families."""
    from qwen_lab.kernels import gemm, pdl_enabled

    monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", "1")
    assert gemm.deterministic_mode() is True
    monkeypatch.setenv("QWEN_LAB_TUNE", "0")
    assert gemm.tuning_enabled() is False
    monkeypatch.setenv("QWEN_LAB_PDL", "1")
    assert pdl_enabled("cpu") is False          # never on the CPU
    monkeypatch.setenv("QWEN_LAB_TUNING_CACHE", "off")
    assert tunings.enabled() is False
    with switches.set(tuning_cache=True):
        assert tunings.enabled() is True


def test_the_persistent_decode_is_chosen_by_its_switch_else_by_the_gpus_it_measured_faster_on(monkeypatch):
    """graph.use_persistent: never on a CPU; the switch when set; unset, the GPUs named in PERSISTENT_FASTER_ON."""
    import torch

    from qwen_lab import graph

    cuda = torch.device("cuda")
    assert not graph.use_persistent(torch.device("cpu"), True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(graph, "PERSISTENT_FASTER_ON", ("H200",))
    monkeypatch.delenv("QWEN_LAB_PERSISTENT_DECODE", raising=False)
    assert not graph.use_persistent(cuda)
    monkeypatch.setattr(graph, "PERSISTENT_FASTER_ON", ("H100", "H200"))
    assert graph.use_persistent(cuda)
    monkeypatch.setenv("QWEN_LAB_PERSISTENT_DECODE", "0")
    assert not graph.use_persistent(cuda)
    with switches.set(persistent_decode=True):
        assert graph.use_persistent(cuda) and not graph.use_persistent(cuda, False)
