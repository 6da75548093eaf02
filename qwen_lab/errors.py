"""The exceptions qwen_lab raises on purpose.

Every error names the file, tensor or argument at fault and what was expected, so a learner
never has to decode a bare shape error from deep inside a kernel.
"""


class QwenLabError(Exception):
    """Base class of every error raised on purpose by qwen_lab."""


class DeviceError(QwenLabError, RuntimeError):
    """A device or dtype asked for that this machine or qwen_lab cannot provide."""


class ConfigError(QwenLabError, ValueError):
    """A config.json (or a preset), or a model option such as the backend, that qwen_lab cannot serve."""


class UnsupportedModelError(ConfigError):
    """A config.json for another architecture (model_type) than dense Qwen3.5."""


class CheckpointError(QwenLabError, ValueError):
    """A snapshot directory or safetensors file that is missing, corrupt or disagrees with its config."""


class GenerationError(QwenLabError, ValueError):
    """Bad arguments to generate(): sampling parameters, prompt ids, lengths."""


class KernelError(QwenLabError, ValueError):
    """A kernel launcher called with tensors it cannot serve (shape, dtype, device, layout)."""


class TokenizerError(QwenLabError, ValueError):
    """Text or chat messages the tokenizer cannot serve, or a chat template that fails on them."""


class TokenizerTypeError(TokenizerError, TypeError):
    """A tokenizer argument of the wrong type (text that is not a str); also a TypeError, as Python's own
    functions raise for one."""
