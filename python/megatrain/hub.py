"""Names of the Hugging Face Hub: models ("meta-llama/Llama-3.2-1B") and
datasets ("HuggingFaceH4/no_robots").

A model name that is not a folder here is downloaded with huggingface_hub
when it is installed (into its cache, only the files megatrain reads: the
configuration, the safetensors weights and the tokenizer files), and the
snapshot folder is used. Without huggingface_hub the library looks in the
local cache itself (src/io/hub_cache.c) and, when the model is not there,
says how to download it.

A dataset name is loaded with `datasets.load_dataset(name, split=...,
streaming=True)` (offline, with HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set:
from the cache, not streamed), so that a run reads only the records it
needs."""
import os
import re

from . import _lib

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# what megatrain reads of a model repository
MODEL_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model"]
_DATA_SUFFIXES = (".jsonl", ".gz", ".zst", ".zstd", ".gzip", ".mtok", ".parquet", ".json",
                  ".yaml", ".yml")


def is_hub_name(s):
    """Whether s (a str) names a Hub repository rather than a path here:
    ORG/NAME, which does not exist as a path and has no data file's
    suffix."""
    return (isinstance(s, str) and bool(_NAME.match(s)) and not os.path.exists(s)
            and not s.lower().endswith(_DATA_SUFFIXES))


def _offline():
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def cache_dir():
    """The cache folder, as the library finds it (src/io/hub_cache.c) and as
    huggingface_hub does: HF_HUB_CACHE, else HF_HOME/hub, else
    XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; read
    when called (huggingface_hub reads the variables once, at import)."""
    env = os.environ.get
    if env("HF_HUB_CACHE") or env("HUGGINGFACE_HUB_CACHE"):
        return env("HF_HUB_CACHE") or env("HUGGINGFACE_HUB_CACHE")
    if env("HF_HOME"):
        return os.path.join(env("HF_HOME"), "hub")
    if env("XDG_CACHE_HOME"):
        return os.path.join(env("XDG_CACHE_HOME"), "huggingface", "hub")
    return os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")


def model_dir(model):
    """The folder of model: itself when it is a path; for a Hub name, the
    snapshot huggingface_hub downloads (or finds in its cache), or the name
    unchanged when huggingface_hub is not installed (the library then looks
    in the cache and says how to download)."""
    if not is_hub_name(model):
        return model
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return model
    try:
        return snapshot_download(model, allow_patterns=MODEL_FILES, cache_dir=cache_dir(),
                                 local_files_only=_offline())
    except Exception as e:  # no network, a gated or missing repository, ...
        raise _lib.MegatrainError(
            f"model '{model}' is not a folder here and could not be downloaded from the Hugging "
            f"Face Hub ({type(e).__name__}: {e}); check the name and your access (hf auth "
            "login for gated models), or give the model's folder") from None


def load_dataset(name, split=None):
    """The records of Hub dataset `name` (its split, "train" by default)."""
    try:
        import datasets
    except ImportError:
        raise _lib.MegatrainError(
            f"data '{name}' is not a file or folder here; as a Hugging Face Hub dataset it needs "
            f"the datasets package (pip install datasets), or download it (hf download "
            f"--repo-type dataset {name} --local-dir DIR) and give DIR") from None
    try:
        return datasets.load_dataset(name, split=split or "train", streaming=not _offline())
    except Exception as e:
        raise _lib.MegatrainError(
            f"data '{name}': the datasets package could not load it ({type(e).__name__}: {e}); "
            "check the name and split=, or give a JSONL, Parquet or .mtok path") from None
