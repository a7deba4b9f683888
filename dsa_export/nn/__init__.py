"""Reference PyTorch modules: the DSA layer, sliding-window attention and a small causal LM."""

from dsa_export.nn.builtin import BUILTIN_CONFIGS, DEFAULT_MODEL, build_builtin, builtin_config
from dsa_export.nn.config import DSAModelConfig
from dsa_export.nn.model import DSACausalLM, example_inputs

__all__ = [
    "BUILTIN_CONFIGS",
    "DEFAULT_MODEL",
    "DSACausalLM",
    "DSAModelConfig",
    "build_builtin",
    "builtin_config",
    "example_inputs",
]
