"""dsa-export: a deployment compiler for DeepSeek Sparse Attention models.

Importing this package is cheap: it never imports TensorRT, never initializes CUDA and does not
import torch until an op or model is used.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
