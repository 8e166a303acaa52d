"""trtrepo: trained model + sample data -> Triton model repository with INT8 TensorRT engines.

The package imports nothing heavy at import time: torch, tensorrt and cuda-python are loaded
lazily inside the adapters that need them.
"""

__version__ = "0.1.0"
