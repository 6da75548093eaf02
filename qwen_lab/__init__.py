"""qwen_lab: the Qwen3.5 forward pass built from hand-written Triton kernels.

    import qwen_lab
    model = qwen_lab.load_model("tiny-english")    # or "tiny", a snapshot directory, "qwen3.5-0.8b", a hub id
    logits = model.forward(ids)                    # [T, vocab] float32
    tokens = qwen_lab.generate(model, ids, max_new_tokens=32)
    tok = qwen_lab.load_tokenizer("tiny-english")
"""

from . import runtime as _runtime

# Must run before any @triton.jit function is defined: on a machine without a GPU the kernels
# run in the Triton interpreter.
_runtime.ensure_interpreter()

from .config import PRESETS, Qwen35Config  # noqa: E402
from .errors import (CheckpointError, ConfigError, DeviceError, GenerationError, KernelError,  # noqa: E402
                     QwenLabError, TokenizerError, UnsupportedModelError)

__version__ = "0.1.0"


def load_model(source="tiny-english", device=None, dtype=None, backend="triton", *, rt=None):
    """Load a Qwen3.5 model: a snapshot directory, a preset ("tiny-english", "tiny", "qwen3.5-0.8b") or a hub id. `rt`: a runtime
    already chosen (qwen_lab.runtime.choose), in place of device and dtype."""
    from .model import load_model as _load

    return _load(source, device=device, dtype=dtype, backend=backend, rt=rt)


def generate(model, input_ids, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0, seed=0,
             cuda_graph=None, **kwargs):
    """Generate new tokens after `input_ids`; returns a LongTensor of the new tokens (qwen_lab.generation)."""
    from .generation import generate as _generate

    return _generate(model, input_ids, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                     top_p=top_p, seed=seed, cuda_graph=cuda_graph, **kwargs)


def load_tokenizer(source="tiny-english"):
    """The tokenizer of a snapshot directory or preset (tokenizer.json + the chat template)."""
    from .tokenizer import load_tokenizer as _load

    return _load(source)


__all__ = ["CheckpointError", "ConfigError", "DeviceError", "GenerationError", "KernelError", "PRESETS", "Qwen35Config",
           "QwenLabError", "TokenizerError", "UnsupportedModelError", "generate", "load_model", "load_tokenizer"]
