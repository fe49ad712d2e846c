"""ctypes bindings of the few functions of include/dmove.h the package uses.

The structures mirror include/dmove.h field by field (enums are C ints); tests/python
checks their sizes against the library's defaults. No compiler is needed: libdmove.so is
loaded as it is, from the package's folder, or from the path in DMOVE_LIB.
"""
import ctypes
import importlib.util
import os

__all__ = ["Error", "lib", "LayerConfig", "LayerOptions", "check", "library_path"]


class Error(RuntimeError):
    """A dmove call failed; the message is dmove's (dm_last_error)."""


class LayerConfig(ctypes.Structure):
    # dm_layer_config
    _fields_ = [
        ("batch", ctypes.c_int64),
        ("seq", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("ffn", ctypes.c_int64),
        ("dropout", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("act", ctypes.c_int),      # dm_act
        ("seed", ctypes.c_uint64),
        ("norm", ctypes.c_int),     # dm_norm
        ("causal", ctypes.c_int),
    ]


class LayerOptions(ctypes.Structure):
    # dm_layer_options
    _fields_ = [
        ("schedule", ctypes.c_int),       # dm_schedule
        ("forward_only", ctypes.c_int),
        ("threads", ctypes.c_int),
        ("no_reuse", ctypes.c_int),
        ("plan", ctypes.c_char_p),
        ("device", ctypes.c_int),         # dm_device_kind
        ("dtype", ctypes.c_int),          # dm_dtype
        ("rows", ctypes.c_int),           # dm_rows
        ("streams", ctypes.c_int),
        ("no_input_grad", ctypes.c_int),
        ("recompute", ctypes.c_int),
        ("unpad", ctypes.c_int),
        ("attention_op", ctypes.c_int),
    ]


ACT = {"gelu": 0, "gelu_tanh": 1, "relu": 2}
DEVICE_CPU, DEVICE_CUDA = 0, 1


def library_path():
    env = os.environ.get("DMOVE_LIB")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libdmove.so")


def _load():
    path = library_path()
    if not os.path.exists(path):
        raise ImportError(
            f"dmove: no shared library at {path}: build it with `make python` in dmove's "
            "source tree and reinstall the package (pip install ./python), or set DMOVE_LIB "
            "to a libdmove.so")
    # torch first, where it is installed: a CUDA build of libdmove.so needs libcublas.so.12
    # and libnccl.so.2 by those names, and the first library of a name loaded serves every
    # later user of it; torch's wheels carry newer ones than a CUDA toolkit may (loaded
    # after the toolkit's NCCL, torch fails: undefined symbol ncclCommResume)
    if importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401
    L = ctypes.CDLL(path)
    st = ctypes.c_int
    P = ctypes.c_void_p
    sigs = {
        "dm_last_error": (ctypes.c_char_p, []),
        "dm_status_name": (ctypes.c_char_p, [st]),
        "dm_layer_config_default": (None, [ctypes.POINTER(LayerConfig)]),
        "dm_layer_config_check": (st, [ctypes.POINTER(LayerConfig)]),
        "dm_layer_new": (st, [ctypes.POINTER(P), ctypes.POINTER(LayerConfig),
                              ctypes.POINTER(LayerOptions)]),
        "dm_layer_free": (None, [P]),
        "dm_layer_tensor": (st, [P, ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(ctypes.c_float)),
                                 ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int64)]),
        "dm_layer_num_params": (ctypes.c_int, [P]),
        "dm_layer_param_name": (ctypes.c_char_p, [P, ctypes.c_int]),
        "dm_layer_set_seed": (st, [P, ctypes.c_uint64]),
        "dm_layer_set_training": (st, [P, ctypes.c_int]),
        "dm_layer_device_tensor": (st, [P, ctypes.c_char_p, ctypes.POINTER(P), ctypes.POINTER(ctypes.c_int)]),
        "dm_layer_tensor_to_device": (st, [P, ctypes.c_char_p]),
        "dm_layer_forward": (st, [P]),
        "dm_layer_backward": (st, [P]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(L, name)
        f.restype = res
        f.argtypes = args
    return L


lib = _load()


def check(status, what=""):
    """Raises Error with dmove's message when a call did not return DM_OK (0)."""
    if status != 0:
        msg = (lib.dm_last_error() or b"").decode("utf-8", "replace")
        name = (lib.dm_status_name(status) or b"").decode()
        raise Error(f"{what + ': ' if what else ''}{msg} ({name})")
