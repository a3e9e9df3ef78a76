"""megatrain from Python: full-precision training of Llama-family models
through libmegatrain (ctypes; the library's header include/megatrain.h is
the contract, python/README.md the manual).

    import megatrain
    summary = megatrain.train({"steps": 50, "device": "cpu"})   # the tiny model
    print(summary["final_loss"], summary["model"])

train, Run          a training run (options: docs/config.md)
generate, eval      a model's continuation of a prompt, its loss on data
init                a new model with random weights
Model, Tokenizer    a loaded model, a tokenizer
Dataset             data tokenized and packed as the trainer sees it
python -m megatrain.tokenize   records, Parquet or JSONL -> a .mtok file
megatrain.integrations         Weights & Biases and MLflow callbacks
megatrain (console script), python -m megatrain   the megatrain command
"""
from ._events import Event, print_event
from ._lib import MegatrainError, library_path
from .data import Dataset
from .model import Model, eval, generate, init
from .run import Run, options_dict, train
from .tokenizer import Tokenizer


def library_version():
    """The version of the libmegatrain in use."""
    from . import _lib
    return _lib.lib().mt_version().decode()


def cuda_archs():
    """The GPU code the library carries ("none (CPU only)" without CUDA)."""
    from . import _lib
    return _lib.lib().mt_cuda_archs().decode()


def _version():
    try:
        from importlib.metadata import version
        return version("megatrain")
    except Exception:
        return "unknown"


__version__ = _version()

__all__ = ["Dataset", "Event", "MegatrainError", "Model", "Run", "Tokenizer", "cuda_archs",
           "eval", "generate", "init", "library_path", "library_version", "options_dict",
           "print_event", "train"]
