"""libmegatrain through ctypes: finding the shared library, the structs and
the prototypes of include/megatrain.h, and the error raised when a call
fails. The header is the contract; every struct here mirrors one of it
field for field (tests/python/test_abi.py compares their sizes and offsets
with a C compiler's).

Where the library comes from, first found wins:
  1. MEGATRAIN_LIB, the path of a libmegatrain.so (an error if it does not load);
  2. the package's own folder (`pip install ./python` builds the library and
     puts a copy there);
  3. the system's loader: LD_LIBRARY_PATH, then the ld.so cache
     (`make install PREFIX=/usr/local` and `ldconfig`).
"""
import contextlib
import ctypes
import ctypes.util
import numbers
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char_p, c_double, c_int, c_int32,
                    c_int64, c_size_t, c_uint64, c_void_p)


class MegatrainError(RuntimeError):
    """A call of the library failed; the message is its mt_last_error()."""


# ---- structs (megatrain.h) ----------------------------------------------

class Guard:
    """The lock of one library handle (shared by a model and its tokenizer),
    the thread and the object inside a call on it, and whether close() is
    waiting for that call (then no new call starts)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.thread = self.obj = None
        self.closing = False


class Handle:
    """An object owning one library handle (self._h), released once: by
    close(), at the end of a `with` block, or when garbage collected.
    Subclasses name themselves in _kind and release in _release.

    The library takes a handle from one thread at a time, so every call
    goes through `with self.use() as h:`, which holds the handle's lock for
    the call: calls from several threads run one after the other. close()
    from another thread lets the call in progress finish, then releases the
    handle; calls made meanwhile or later raise "it was closed". A call on
    the object from inside a call on it (from an event callback) is
    refused: the library is not re-entrant. (A model's tokenizer may be used
    inside a call on its model: the model stays open meanwhile.)"""
    _h = None
    _kind = "handle"

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self._guard = Guard()
        return self

    def _release(self, h):
        raise NotImplementedError

    def _check_open(self):
        if not self._h or self._guard.closing:
            raise MegatrainError(f"{self._kind}: it was closed")

    def _inside(self, what):
        """True when this thread is in a call on another object of the same
        lock; a call on this very object raises."""
        g = self._guard
        if g.thread != threading.get_ident():
            return False
        if g.obj is self or what == "close()":
            raise MegatrainError(
                f"{self._kind}: {what} from inside a call on it (an event callback?): the "
                "library is not re-entrant; do it after the call returns")
        return True

    @contextlib.contextmanager
    def use(self):
        """The handle, held for this thread until the block ends."""
        if self._inside("a call"):  # the lock is this thread's already
            self._check_open()
            yield self._h
            return
        self._check_open()  # a close() waiting: do not queue behind it
        with self._guard.lock:
            g = self._guard
            g.thread, g.obj = threading.get_ident(), self
            try:
                self._check_open()
                yield self._h
            finally:
                g.thread = g.obj = None

    def close(self):
        self._inside("close()")
        self._guard.closing = True  # no new call starts
        with self._guard.lock:
            if self._h:
                self._release(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class StepMetrics(Structure):
    _fields_ = [("step", c_int64), ("total_steps", c_int64), ("epoch", c_double),
                ("loss", c_double), ("lr", c_double), ("grad_norm", c_double),
                ("tokens", c_int64), ("tokens_per_s", c_double), ("tflops", c_double),
                ("step_time_s", c_double), ("eta_s", c_double), ("gpu_mem_gb", c_double),
                ("host_mem_gb", c_double), ("h2d_gbps", c_double), ("d2h_gbps", c_double),
                ("skipped", c_int64), ("nonfinite", c_char_p),
                ("rewards_chosen", c_double), ("rewards_rejected", c_double),
                ("rewards_accuracies", c_double), ("rewards_margins", c_double),
                ("logps_chosen", c_double), ("logps_rejected", c_double)]


class Event(Structure):
    _fields_ = [("kind", c_int), ("text", c_char_p), ("step", POINTER(StepMetrics))]


EVENT_INFO, EVENT_WARNING, EVENT_STEP, EVENT_TEXT = range(4)
EventFn = CFUNCTYPE(None, POINTER(Event), c_void_p)


class OptionInfo(Structure):
    _fields_ = [("name", c_char_p), ("type", c_char_p), ("default_value", c_char_p),
                ("tiny_default", c_char_p), ("choices", c_char_p), ("section", c_char_p),
                ("help", c_char_p)]


class DatasetOpts(Structure):
    _fields_ = [("format", c_char_p), ("chat_template", c_char_p), ("packing", c_char_p),
                ("skip_bad_lines", c_bool), ("seed", c_uint64), ("epochs", c_int64),
                ("vocab_size", c_int64), ("text_field", c_char_p)]


class DatasetInfo(Structure):
    _fields_ = [("documents", c_int64), ("tokens", c_int64), ("trainable", c_int64),
                ("skipped_lines", c_int64), ("format", c_char_p), ("chat_template", c_char_p),
                ("packing", c_char_p)]


class ModelInfo(Structure):
    _fields_ = [("model_type", c_char_p), ("n_params", c_int64), ("layers", c_int64),
                ("hidden", c_int64), ("heads", c_int64), ("kv_heads", c_int64), ("ffn", c_int64),
                ("vocab_size", c_int64), ("max_positions", c_int64), ("tied_embeddings", c_bool),
                ("experts", c_int64), ("experts_per_tok", c_int64), ("active_params", c_int64)]


class ModelShape(Structure):
    _fields_ = [("hidden", c_int64), ("layers", c_int64), ("heads", c_int64),
                ("kv_heads", c_int64), ("ffn", c_int64), ("max_positions", c_int64),
                ("rope_theta", c_double), ("init_std", c_double), ("untied", c_bool),
                ("seed", c_uint64), ("model_type", c_char_p), ("experts", c_int64),
                ("experts_per_tok", c_int64), ("expert_ffn", c_int64),
                ("shared_expert_ffn", c_int64), ("norm_topk", c_int)]


class EvalOpts(Structure):
    _fields_ = [("data", c_char_p), ("format", c_char_p), ("chat_template", c_char_p),
                ("packing", c_char_p), ("seq_len", c_int64), ("batch_size", c_int64),
                ("micro_batches", c_int64), ("max_batches", c_int64),
                ("device", c_char_p), ("precision", c_char_p), ("dump_logits", c_char_p),
                ("text_field", c_char_p), ("objective", c_char_p), ("loss_type", c_char_p),
                ("beta", c_double), ("label_smoothing", c_double), ("gamma", c_double),
                ("lambda", c_double), ("ref_model", c_char_p), ("skip_bad_pairs", c_int)]


class EvalResult(Structure):
    _fields_ = [("loss", c_double), ("perplexity", c_double), ("tokens", c_int64),
                ("batches", c_int64), ("rewards_chosen", c_double),
                ("rewards_rejected", c_double), ("rewards_accuracies", c_double),
                ("rewards_margins", c_double), ("logps_chosen", c_double),
                ("logps_rejected", c_double), ("pairs", c_int64), ("skipped_pairs", c_int64)]


class GenerateOpts(Structure):
    _fields_ = [("prompt", c_char_p), ("max_new_tokens", c_int64), ("temperature", c_double),
                ("top_p", c_double), ("seed", c_uint64), ("context", c_int64),
                ("device", c_char_p), ("add_special", c_bool), ("messages", c_char_p),
                ("chat_template", c_char_p)]


STRUCTS = {"mt_step_metrics": StepMetrics, "mt_event": Event, "mt_option_info": OptionInfo,
           "mt_dataset_opts": DatasetOpts, "mt_dataset_info": DatasetInfo,
           "mt_model_info": ModelInfo, "mt_model_shape": ModelShape, "mt_eval_opts": EvalOpts,
           "mt_eval_result": EvalResult, "mt_generate_opts": GenerateOpts}

# ---- prototypes: name -> (restype, argtypes) ----------------------------

_p = c_void_p  # every handle, and every string the caller frees (mt_free)
PROTOTYPES = {
    "mt_version": (c_char_p, []),
    "mt_cuda_archs": (c_char_p, []),
    "mt_last_error": (c_char_p, []),
    "mt_free": (None, [c_void_p]),
    "mt_options_new": (_p, []),
    "mt_options_free": (None, [_p]),
    "mt_options_set": (c_int, [_p, c_char_p, c_char_p]),
    "mt_options_get": (c_int, [_p, c_char_p, c_char_p, c_size_t]),
    "mt_options_load_yaml": (c_int, [_p, c_char_p]),
    "mt_options_set_json": (c_int, [_p, c_char_p]),
    "mt_options_resolve": (c_int, [_p]),
    "mt_options_parse_args": (c_int, [_p, c_int, POINTER(c_char_p)]),
    "mt_options_to_yaml": (_p, [_p]),
    "mt_options_to_json": (_p, [_p]),
    "mt_options_usage": (_p, []),
    "mt_options_count": (c_size_t, []),
    "mt_options_describe": (c_int, [c_size_t, POINTER(OptionInfo)]),
    "mt_run_open": (_p, [_p, EventFn, c_void_p]),
    "mt_run_step": (c_int, [_p, POINTER(StepMetrics)]),
    "mt_run_save": (c_int, [_p]),
    "mt_run_finish": (c_int, [_p]),
    "mt_run_train": (c_int, [_p]),
    "mt_run_steps_done": (c_int64, [_p]),
    "mt_run_total_steps": (c_int64, [_p]),
    "mt_run_close": (None, [_p]),
    "mt_tokenizer_open": (_p, [c_char_p]),
    "mt_tokenizer_free": (None, [_p]),
    "mt_tokenizer_tokenize": (c_int, [_p, c_char_p, c_size_t, c_bool, POINTER(POINTER(c_int32)),
                                      POINTER(c_size_t)]),
    "mt_tokenizer_decode": (_p, [_p, POINTER(c_int32), c_size_t, c_bool]),
    "mt_tokenizer_vocab_size": (c_size_t, [_p]),
    "mt_tokenizer_bos_id": (c_int32, [_p]),
    "mt_tokenizer_eos_id": (c_int32, [_p]),
    "mt_tokenizer_token_id": (c_int32, [_p, c_char_p]),
    "mt_dataset_opts_defaults": (None, [POINTER(DatasetOpts)]),
    "mt_dataset_load": (_p, [c_char_p, _p, POINTER(DatasetOpts)]),
    "mt_dataset_free": (None, [_p]),
    "mt_dataset_save": (c_int, [_p, c_char_p]),
    "mt_dataset_describe": (c_int, [_p, POINTER(DatasetInfo)]),
    "mt_dataset_next_batch": (c_int, [_p, c_int64, c_int64, POINTER(c_int32), POINTER(c_int32),
                                      POINTER(c_int32)]),
    "mt_model_open": (_p, [c_char_p, c_char_p]),
    "mt_model_close": (None, [_p]),
    "mt_model_describe": (c_int, [_p, POINTER(ModelInfo)]),
    "mt_model_tokenizer": (_p, [_p]),
    "mt_model_shape_defaults": (None, [POINTER(ModelShape)]),
    "mt_model_init": (c_int, [c_char_p, c_char_p, POINTER(ModelShape), POINTER(ModelInfo)]),
    "mt_eval_opts_defaults": (None, [POINTER(EvalOpts)]),
    "mt_model_eval": (c_int, [_p, POINTER(EvalOpts), POINTER(EvalResult)]),
    "mt_generate_opts_defaults": (None, [POINTER(GenerateOpts)]),
    "mt_model_generate": (_p, [_p, POINTER(GenerateOpts), EventFn, c_void_p]),
}

# ---- loading -----------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    """(how it was found, what to pass to CDLL), in the order tried."""
    env = os.environ.get("MEGATRAIN_LIB")
    if env:
        return [("MEGATRAIN_LIB", env)]
    out = []
    bundled = os.path.join(HERE, "libmegatrain.so")
    if os.path.exists(bundled):
        out.append(("the package folder", bundled))
    out.append(("the system loader", "libmegatrain.so"))
    found = ctypes.util.find_library("megatrain")
    if found:
        out.append(("the system loader", found))
    return out


def _open():
    tried = []
    for how, name in _candidates():
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            tried.append(f"{name} ({how}): {e}")
            if how == "MEGATRAIN_LIB":
                raise MegatrainError(
                    f"MEGATRAIN_LIB={name}: cannot load it: {e}; point it at a libmegatrain.so "
                    "(`make build` writes build/libmegatrain.so) or unset it") from None
    raise MegatrainError(
        "libmegatrain.so not found (tried " + "; ".join(tried) + "); install the package with "
        "`pip install ./python` from a megatrain checkout (it builds and bundles the library), "
        "set MEGATRAIN_LIB=/path/to/libmegatrain.so, or `make install` and add its lib/ to "
        "LD_LIBRARY_PATH")


def lib():
    """The loaded library, its prototypes declared (loaded on first use)."""
    global _lib, _lib_path
    if _lib is None:
        with _lock:
            if _lib is None:
                handle, path = _open()
                for name, (res, args) in PROTOTYPES.items():
                    try:
                        fn = getattr(handle, name)
                    except AttributeError:
                        raise MegatrainError(
                            f"{path} lacks {name}: it is older than this package; rebuild it "
                            "(`pip install ./python` again, or `make build`)") from None
                    fn.restype, fn.argtypes = res, args
                _lib_path = path
                _lib = handle
    return _lib


def library_path():
    """The path (or name) of the libmegatrain.so in use."""
    lib()
    return _lib_path


def last_error():
    return lib().mt_last_error().decode("utf-8", "replace")


def check(rc):
    """Raises MegatrainError with the library's message when rc is -1 (or
    NULL); returns rc otherwise."""
    if rc is None or (isinstance(rc, int) and rc < 0):
        raise MegatrainError(last_error())
    return rc


def enc(s):
    """Text for a const char * (None stays NULL)."""
    if s is None:
        return None
    return os.fsencode(s) if isinstance(s, os.PathLike) else str(s).encode("utf-8")


def dec(b):
    return None if b is None else b.decode("utf-8", "replace")


def take_string(p):
    """A char * the library returned to the caller: its text, then mt_free."""
    if not p:
        return None
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        lib().mt_free(p)


# The integer types of the header and the values they hold. ctypes keeps
# only the low bits of a Python int that does not fit (2**64 + 3 becomes 3,
# -1 becomes 2**64 - 1): every integer goes through to_c first.
_INT_RANGES = {c_int32: (-2**31, 2**31 - 1), c_int64: (-2**63, 2**63 - 1),
               c_uint64: (0, 2**64 - 1)}
_INT_RANGES[c_int] = (-2**(8 * ctypes.sizeof(c_int) - 1), 2**(8 * ctypes.sizeof(c_int) - 1) - 1)
_INT_RANGES[c_size_t] = (0, 2**(8 * ctypes.sizeof(c_size_t)) - 1)


def to_c(name, ctype, v):
    """v as a value of ctype, or an error naming `name`: an integer that
    does not fit is a ValueError (not its low bits), a float too large
    for a double one too, and a value of another kind (a float for an
    integer, a bool for a number) a TypeError."""
    if ctype in _INT_RANGES:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name}: expected an integer, got {v!r}")
        lo, hi = _INT_RANGES[ctype]
        if not lo <= int(v) <= hi:
            raise ValueError(f"{name}: {int(v)} does not fit: it must be between {lo} and {hi}")
        return int(v)
    if ctype is c_double:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name}: expected a number, got {v!r}")
        try:
            return float(v)
        except OverflowError:
            raise ValueError(f"{name}: {v} is too large for a double") from None
    if ctype is c_bool:
        if not isinstance(v, (bool, numbers.Integral)) or int(v) not in (0, 1):
            raise TypeError(f"{name}: expected True or False, got {v!r}")
        return bool(v)
    return v


def int_array(name, ctype, values):
    """A ctypes array of values, each checked by to_c."""
    values = [to_c(f"{name}[{i}]", ctype, v) for i, v in enumerate(values)]
    return (ctype * len(values))(*values)


def struct_dict(s, skip=()):
    """A struct as a dict of Python values (char * as str)."""
    out = {}
    for name, _ in s._fields_:
        if name in skip:
            continue
        v = getattr(s, name)
        out[name] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return out
