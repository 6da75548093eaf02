"""generate(): argument checking, EOS, sampling reproducibility, and the command line."""

import re
import subprocess
import sys
import types

import pytest
import torch

import qwen_lab
from qwen_lab import GenerationError


@pytest.fixture(scope="module")
def model():
    return qwen_lab.load_model("tiny", device="cpu", dtype=torch.float32, backend="torch")


@pytest.mark.parametrize("kwargs, names", [
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(max_new_tokens=2.5), "max_new_tokens"),
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-3), "top_k"),
    (dict(temperature=True), "temperature"),
    (dict(seed="x"), "seed"),
    (dict(seed=1.5), "seed"),
])
def test_bad_sampling_arguments_raise_naming_the_argument(model, kwargs, names):
    with pytest.raises(GenerationError, match=names):
        qwen_lab.generate(model, [1, 2, 3], **kwargs)


@pytest.mark.parametrize("ids, fragment", [
    ([], "empty"),
    (torch.tensor([], dtype=torch.long), "empty"),
    ([1, 2, 512], "outside \\[0, 512\\)"),
    ([-1, 2], "outside"),
    (torch.tensor([1.0, 2.0]), "integer"),
    ("hello", "integer token ids|expected"),
    (torch.ones(2, 3, dtype=torch.long), "shape"),
])
def test_bad_prompts_raise(model, ids, fragment):
    with pytest.raises(GenerationError, match=fragment):
        qwen_lab.generate(model, ids, max_new_tokens=2)


def test_prompt_longer_than_the_cache_raises(model):
    with pytest.raises(GenerationError, match="max_len=4"):
        qwen_lab.generate(model, list(range(10)), max_new_tokens=2, max_len=4)
    with pytest.raises(GenerationError, match="exceeds the cache"):
        qwen_lab.generate(model, list(range(3)), max_new_tokens=5, max_len=4)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(max_len="x"), "max_len='x'; expected a positive integer"),
    (dict(max_len=2.5), "max_len=2.5"),
    (dict(max_len=0), "max_len=0"),
    (dict(eos_token_ids=5), "eos_token_ids=5; expected a list"),
    (dict(eos_token_ids="ab"), "eos_token_ids='ab'"),
    (dict(eos_token_ids=[1, True]), "eos_token_ids"),
    (dict(stream=5), "stream=5; expected a function"),
])
def test_bad_keyword_arguments_raise_naming_the_argument(model, kwargs, fragment):
    with pytest.raises(GenerationError, match=fragment):
        qwen_lab.generate(model, [1, 2, 3], max_new_tokens=2, **kwargs)


@pytest.mark.parametrize("max_len", [0, -3, 2.5, "8", True, None])
def test_new_cache_rejects_a_bad_length_naming_it(model, max_len):
    with pytest.raises(GenerationError, match=re.escape(f"max_len={max_len!r}; expected a positive integer")) as e:
        model.new_cache(max_len)
    assert isinstance(e.value, qwen_lab.QwenLabError) and isinstance(e.value, ValueError)


def test_new_cache_takes_any_integer_length(model):
    assert model.new_cache(3).max_len == 3
    assert model.new_cache(torch.tensor(5)).max_len == 5  # e.g. ids.numel() kept as a tensor


def test_eos_ids_may_come_from_an_iterator(model):
    first = int(qwen_lab.generate(model, [1, 2, 3], max_new_tokens=1, eos_token_ids=())[0])
    got = qwen_lab.generate(model, [1, 2, 3], max_new_tokens=5, eos_token_ids=iter([first]))
    assert got.tolist() == [first]  # stopped at the first token: the iterator's id was kept


def test_too_many_new_tokens_name_the_model_limit(model):
    limit = model.config.max_position_embeddings
    with pytest.raises(GenerationError, match=f"max_new_tokens \\({limit}\\).*max_position_embeddings={limit}"):
        qwen_lab.generate(model, [1, 2, 3], max_new_tokens=limit)


def test_forward_rejects_bad_ids_too(model):
    with pytest.raises(GenerationError, match="outside"):
        model.forward([0, 9999])


def test_zero_new_tokens_gives_an_empty_result(model):
    out = qwen_lab.generate(model, [1, 2, 3], max_new_tokens=0)
    assert out.dtype == torch.long and out.numel() == 0


def test_sampling_is_reproducible_by_seed_and_varies_across_seeds(model):
    a = qwen_lab.generate(model, [3, 4, 5], max_new_tokens=12, temperature=1.5, seed=7, eos_token_ids=())
    b = qwen_lab.generate(model, [3, 4, 5], max_new_tokens=12, temperature=1.5, seed=7, eos_token_ids=())
    others = [qwen_lab.generate(model, [3, 4, 5], max_new_tokens=12, temperature=1.5, seed=s, eos_token_ids=())
              for s in (8, 9, 10)]
    assert a.tolist() == b.tolist()
    assert any(o.tolist() != a.tolist() for o in others)


def test_top_k_one_is_greedy(model):
    greedy = qwen_lab.generate(model, [3, 4, 5], max_new_tokens=10, eos_token_ids=())
    top1 = qwen_lab.generate(model, [3, 4, 5], max_new_tokens=10, temperature=0.8, top_k=1, seed=3,
                             eos_token_ids=())
    assert greedy.tolist() == top1.tolist()


def test_generation_stops_at_eos_and_streams(model):
    greedy = qwen_lab.generate(model, [3, 4, 5], max_new_tokens=10, eos_token_ids=())
    stop = int(greedy[4])
    first = greedy.tolist().index(stop)
    seen = []
    out = qwen_lab.generate(model, [3, 4, 5], max_new_tokens=10, eos_token_ids=[stop], stream=seen.append)
    assert out.tolist() == greedy.tolist()[:first + 1]
    assert seen == out.tolist()


def test_numpy_numbers_are_numbers(model):
    """A sweep over np.arange hands generate() NumPy scalars: they are the integers and numbers they hold (and are
    passed on as Python numbers, which the kernels' own checks ask for)."""
    np = pytest.importorskip("numpy")
    plain = qwen_lab.generate(model, [3, 4, 5], max_new_tokens=4, temperature=0.75, top_k=9, top_p=0.875, seed=2,
                              eos_token_ids=(), max_len=16)
    numpy = qwen_lab.generate(model, np.array([3, 4, 5]), max_new_tokens=np.int64(4), temperature=np.float32(0.75),
                              top_k=np.int32(9), top_p=np.float16(0.875), seed=np.uint64(2), eos_token_ids=(),
                              max_len=np.int64(16))
    assert numpy.tolist() == plain.tolist()


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(temperature=torch.tensor(0.5)), r"temperature=tensor\(0.5000\) \(a torch.Tensor\); expected a finite"),
    (dict(top_k=torch.tensor(3)), r"top_k=.* \(a torch.Tensor\); expected an integer"),
    (dict(cuda_graph="no"), "cuda_graph='no'; expected True, False or None"),
])
def test_arguments_of_the_wrong_kind_are_named(model, kwargs, fragment):
    with pytest.raises(GenerationError, match=fragment):
        qwen_lab.generate(model, [1, 2, 3], max_new_tokens=2, **kwargs)


def test_a_source_name_in_place_of_the_model_is_named():
    for model in ("tiny", None):
        with pytest.raises(GenerationError, match="expected a model from qwen_lab.load_model"):
            qwen_lab.generate(model, [1, 2, 3], max_new_tokens=2)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_temperature_too_small_for_float32_is_refused_before_any_work(backend, monkeypatch):
    """Below log2(e) / float32's max the sampler's scaled logits overflow: the reference drew a wrong token (an EOS
    id, so generation stopped) or failed deep inside, the kernel refused only after the prefill. Both backends now
    refuse it first; just above it, both draw the greedy token."""
    model = qwen_lab.load_model("tiny", backend=backend)  # the GPU where there is one: the kernel's own test there

    def no_prefill(*args, **kwargs):
        raise AssertionError("the prompt was prefilled before the temperature was checked")
    monkeypatch.setattr(model, "step", no_prefill)
    for t in (1e-40, 1e-300, 4e-39):
        with pytest.raises(GenerationError, match=f"temperature={t!r} is too small"):
            qwen_lab.generate(model, [3, 4, 5], max_new_tokens=2, temperature=t)
    monkeypatch.undo()
    greedy = qwen_lab.generate(model, [3, 4, 5], max_new_tokens=3, eos_token_ids=())
    cold = qwen_lab.generate(model, [3, 4, 5], max_new_tokens=3, temperature=1e-37, top_p=0.5, eos_token_ids=())
    assert cold.tolist() == greedy.tolist()


def test_cli_stops_at_the_eos_ids_of_both_config_files(monkeypatch, capsys):
    """generate() stops by default at the ids of generation_config.json and config.json (model.config merges
    them); the command line took the tokenizer's, generation_config.json's alone, and ran past config.json's."""
    from qwen_lab import generation as cli

    real_load = qwen_lab.load_model
    first = int(qwen_lab.generate(real_load("tiny-english", backend="torch"), cli_prompt_ids(), max_new_tokens=1,
                                  eos_token_ids=())[0])

    def load(*args, **kwargs):
        m = real_load(*args, **kwargs)
        m.config = m.config.replace(eos_token_ids=(first,))  # as if config.json named it, generation_config.json not
        return m
    monkeypatch.setattr(qwen_lab, "load_model", load)
    assert cli.main(["--backend", "torch", "--max-new-tokens", "6"]) == 0
    assert "[1 tokens in" in capsys.readouterr().err


def cli_prompt_ids():
    """The command line's default prompt, as the default model's tokens."""
    from qwen_lab.generation import _parser

    return qwen_lab.load_tokenizer(_parser().get_default("model")).encode(_parser().get_default("prompt"))


def test_cuda_graph_on_cpu_is_refused(model):
    with pytest.raises(GenerationError, match="cuda_graph"):
        qwen_lab.generate(model, [1, 2], max_new_tokens=2, cuda_graph=True)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "qwen_lab.generate", *args], capture_output=True, text=True,
                          timeout=600)


def test_cli_generates_on_the_tiny_default():
    r = run_cli("--max-new-tokens", "4", "--backend", "torch")
    assert r.returncode == 0, r.stderr
    # the prompt, then what generate() gives for it with the CLI's defaults (greedy, seed 0, its stop ids, the
    # device and dtype the runtime picks)
    prompt = "The GPU reads every weight once per token, so"
    tok = qwen_lab.load_tokenizer("tiny-english")     # the CLI's default model
    model = qwen_lab.load_model("tiny-english", backend="torch")
    eos = [*tok.eos_token_ids, *model.config.eos_token_ids]
    new = qwen_lab.generate(model, torch.tensor(tok.encode(prompt)), max_new_tokens=4, seed=0, eos_token_ids=eos)
    assert len(new) >= 1
    assert r.stdout == prompt + tok.decode(new.tolist()) + "\n", (r.stdout, tok.decode(new.tolist()))
    assert f"[{len(new)} tokens in " in r.stderr, r.stderr


def test_cli_chat_uses_the_template():
    r = run_cli("--chat", "--prompt", "hi", "--max-new-tokens", "3", "--backend", "torch", "--temperature", "0.7",
                "--top-p", "0.9", "--seed", "1")
    assert r.returncode == 0, r.stderr
    assert "<|im_start|>user\nhi<|im_end|>" in r.stdout and "<|im_start|>assistant\n" in r.stdout


def test_cli_help_describes_every_flag_with_its_default(capsys):
    from qwen_lab.generation import _parser, main

    flags = {}
    for action in _parser()._actions:
        if action.dest != "help":
            assert action.help and "default" in action.help, f"{action.option_strings}: no help, or no default in it"
            flags[action.option_strings[0]] = action
    # DESIGN.md's command line, and its defaults
    assert {"--model", "--prompt", "--chat", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--seed",
            "--no-cuda-graph"} <= set(flags)
    assert {f: flags[f].default for f in ("--model", "--max-new-tokens", "--temperature", "--top-k", "--top-p",
                                          "--seed")} == {"--model": "tiny-english", "--max-new-tokens": 32,
                                                         "--temperature": 0.0, "--top-k": 0, "--top-p": 1.0,
                                                         "--seed": 0}
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare with single spaces
    for fragment in ("(default: tiny-english)", "(default: 32)", "(default: 0.0)", "(default: 1.0)",
                     "on a CPU (the Triton interpreter) each token of the tiny-english model takes about a second"):
        assert fragment in text, fragment


def test_cli_reports_bad_arguments_in_one_line():
    r = run_cli("--top-p", "2")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("error: top_p=2")


def test_cli_checks_the_length_and_the_seed_before_printing_the_prompt():
    for args, fragment in ((("--max-new-tokens", "5000"), "error: --max-new-tokens 5000"),
                           (("--seed", "99999999999999999999999"), "error: seed=")):
        r = run_cli(*args, "--backend", "torch")
        assert r.returncode == 2
        assert r.stdout == ""  # nothing printed that the error would be glued to
        assert r.stderr.strip().splitlines()[-1].startswith(fragment), r.stderr


def test_load_model_checks_the_backend_before_reading_weights(monkeypatch):
    from qwen_lab import weights
    from qwen_lab.errors import ConfigError

    def never(*args, **kwargs):
        raise AssertionError("the weights were read before the backend was checked")
    monkeypatch.setattr(weights, "load_weights", never)
    with pytest.raises(ConfigError, match="backend='cuda'; expected one of"):
        qwen_lab.load_model("tiny", backend="cuda")


def test_interpreter_accepts_runtime_loop_bounds():
    """A kernel looping up to a runtime scalar (an argument, or a value loaded from memory) runs on the CPU too."""
    import triton
    import triton.language as tl

    @triton.jit
    def sum_kernel(x_ptr, meta_ptr, out_ptr, n, BLOCK: tl.constexpr):
        acc = tl.zeros([BLOCK], tl.float32)
        for i in range(0, n, BLOCK):
            offs = i + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        repeats = tl.load(meta_ptr)
        total = tl.sum(acc)
        for _ in range(1, repeats):
            total += tl.sum(acc)
        tl.store(out_ptr, total)

    device = qwen_lab.runtime.choose().device
    x = torch.arange(100, dtype=torch.float32, device=device)
    meta = torch.tensor([3], dtype=torch.int32, device=device)
    out = torch.zeros(1, device=device)
    sum_kernel[(1,)](x, meta, out, 100, BLOCK=16)
    assert out.item() == 3 * 4950


def test_status_reports_each_warm_up_phase(model):
    phases = []
    qwen_lab.generate(model, [1, 2, 3], max_new_tokens=2, status=phases.append)
    assert phases == ["prefill of 3 tokens"]  # the PyTorch backend (and any CPU): no decode graph to capture
    with pytest.raises(GenerationError, match="status=3; expected a function"):
        qwen_lab.generate(model, [1, 2, 3], max_new_tokens=2, status=3)


@pytest.mark.gpu
def test_status_reports_the_graph_capture_first_on_a_gpu():
    """On a GPU with the Triton backend the decode step is captured before the prefill: the caller's display hears of
    the capture first, then of the prefill."""
    gpu_model = qwen_lab.load_model("tiny", device="cuda", backend="triton")
    phases = []
    qwen_lab.generate(gpu_model, [1, 2, 3], max_new_tokens=2, status=phases.append)
    assert len(phases) == 2 and phases[0].startswith("capturing the decode step") and phases[1] == "prefill of 3 tokens"


def test_without_a_status_the_warm_up_shows_its_own_line_where_it_is_long(model, capsys):
    """A notebook's generate() on a GPU spends its first minute compiling: with no `status` of the caller's it shows
    a progress line on stderr, removed before the tokens come; on a CPU (or the PyTorch backend) it shows none."""
    from qwen_lab.generation import status_line

    assert status_line(model) is None  # this machine's model: the interpreter, no long warm-up
    assert status_line(types.SimpleNamespace(device=torch.device("cuda"), backend="torch")) is None
    line = status_line(types.SimpleNamespace(device=torch.device("cuda"), backend="triton"))
    line.set_postfix_str("prefill of 3 tokens")
    line.close()
    assert "warm-up, prefill of 3 tokens [" in capsys.readouterr().err
    qwen_lab.generate(model, [1, 2, 3], max_new_tokens=2)
    assert "warm-up" not in capsys.readouterr().err
