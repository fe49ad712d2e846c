"""dmove's fused BERT encoder layer inside PyTorch.

``BertLayer`` is a ``torch.nn.Module`` with the parameters (names, shapes, ``state_dict``
keys) of transformers' ``BertLayer``; its forward and backward run dmove's fused layer
(``dm_layer_forward`` / ``dm_layer_backward``) through a ``torch.autograd.Function``.
``patch(model)`` puts one in place of every transformers ``BertLayer`` of a model, sharing
its ``Parameter`` objects.

What dmove takes: float32 CPU tensors, or CUDA tensors (float32, bfloat16 or float16; under
autocast the autocast dtype) where libdmove.so was built with CUDA; hidden_states (b, j,
hidden) of any strides, the attention mask as transformers gives it to a layer (None, (b, j)
of 1/0, or (b, 1, 1, j) / (b, 1, j, j) additive float or bool, the same for every query), on
the hidden states' device. Anything else raises TypeError / ValueError saying why. The
copies per step are counted in ``copy_stats()``.

On a GPU the layer is dmove's CUDA backend in that storage type: its buffers on the device
are torch tensors (DLPack views of dmove's memory), so the inputs, parameters, outputs and
gradients are copied device to device, converted where the types differ, never through the
host; torch's stream is waited for before dmove reads them, and dmove's passes end with
their work done. ``BertLayer(config, dmove_device="cuda")`` puts CPU tensors through the
CUDA backend too: the CUDA build's host emulation (DMOVE_CUDA_EMULATE=1), for tests.

``unpad=True`` (``BertLayer(config, unpad=True)``, ``patch(model, unpad=True)``): when a
batch's mask is padding at the end of each sequence, the layer runs on the real tokens
alone (dmove's unpadded layer: the tokens packed, attention over each sequence's own
length) and returns 0 at the padded positions, where transformers computes values nothing
should read. The loss and every gradient are the same as long as nothing reads the padded
positions (labels -100 there, as transformers' collators make them); a mask of another
shape runs padded.
"""
import contextlib
import ctypes
import math
import os
import threading
import weakref

import torch
from torch import nn

from . import _lib
from ._lib import Error, check, lib

__all__ = ["BertLayer", "patch", "set_num_threads", "get_num_threads", "copy_stats",
           "reset_copy_stats", "Error"]

_threads = 0  # 0: follow torch.get_num_threads()
_MAX_PENDING = 8   # forwards of one layer and shape waiting for their backward
_MAX_SHAPES = 4    # (batch, seq) shapes a module keeps a dmove layer for

# Bytes copied between torch's tensors and dmove's buffers since reset_copy_stats():
#   hidden_in, mask_in, params_in (only parameters changed since the layer last saw them),
#   output_out (forward), grad_output_in, grad_input_out, param_grads_out (backward).
_copies = {k: 0 for k in ("hidden_in", "mask_in", "params_in", "output_out",
                          "grad_output_in", "grad_input_out", "param_grads_out")}
_calls = {"forward": 0, "backward": 0}


def copy_stats():
    """Bytes copied per kind (and the forward/backward calls) since reset_copy_stats()."""
    d = dict(_copies)
    d.update(_calls)
    d["total"] = sum(_copies.values())
    return d


def reset_copy_stats():
    for k in _copies:
        _copies[k] = 0
    for k in _calls:
        _calls[k] = 0


def set_num_threads(n):
    """Threads of the dmove layers made from now on (0: torch.get_num_threads())."""
    global _threads
    if int(n) < 0:
        raise ValueError("dmove.torch.set_num_threads: n must be >= 0")
    _threads = int(n)


def get_num_threads():
    return _threads or torch.get_num_threads()


_ACTS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
         "gelu_fast": "gelu_tanh", "gelu_accurate": "gelu_tanh", "gelu_tanh": "gelu_tanh", "relu": "relu"}


def _device_wait(core):
    """Before dmove reads what torch wrote to a core's GPU buffers: torch's queued work done
    (dmove runs on streams of its own; its passes end with their work done)."""
    if core.device is not None and core.device[0].type == "cuda":
        torch.cuda.current_stream(core.device[0]).synchronize()


def _on(device):
    """The CUDA device of a core's (device, dtype) current while dmove works on it."""
    if device is not None and device[0].type == "cuda":
        return torch.cuda.device(device[0])
    return contextlib.nullcontext()


def _layer_settings(config):
    """(hidden, heads, ffn, dropout, eps, act) from a transformers BertConfig, or refuses."""
    g = lambda k, d=None: getattr(config, k, d)
    hidden, heads, ffn = g("hidden_size"), g("num_attention_heads"), g("intermediate_size")
    if None in (hidden, heads, ffn):
        raise ValueError("dmove.torch.BertLayer: the config needs hidden_size, "
                         "num_attention_heads and intermediate_size (a transformers BertConfig)")
    if hidden % heads:
        raise ValueError(f"dmove.torch.BertLayer: hidden_size {hidden} is not a multiple of "
                         f"num_attention_heads {heads}")
    act = g("hidden_act", "gelu")
    if not isinstance(act, str) or act not in _ACTS:
        raise ValueError(f"dmove.torch.BertLayer: hidden_act {act!r}: dmove takes "
                         f"{', '.join(sorted(_ACTS))}")
    p_hidden = float(g("hidden_dropout_prob", 0.1))  # attention_probs_dropout_prob: the
    # layer's attention dropout (the three must be equal to train: BertLayer._live_settings)
    if g("is_decoder", False) or g("add_cross_attention", False):
        raise ValueError("dmove.torch.BertLayer: decoder layers (is_decoder, cross-attention) "
                         "are not taken: dmove's layer is an encoder layer")
    pet = g("position_embedding_type", "absolute")
    if pet not in (None, "absolute"):
        raise ValueError(f"dmove.torch.BertLayer: position_embedding_type {pet!r}: dmove's "
                         "attention has no relative position terms (absolute only)")
    return (int(hidden), int(heads), int(ffn), p_hidden, float(g("layer_norm_eps", 1e-12)),
            _ACTS[act])


def _act_of(fn):
    """dmove's name of an activation module (transformers' ACT2FN ones, torch's), told by
    its values: gelu (erf), gelu_tanh or relu; None for another. The values span the
    pre-activations a layer meets and far past them, so that a clipped variant (ReLU6,
    transformers' gelu_10) or one that differs only in its tails is told apart."""
    x = torch.cat([torch.linspace(-6.0, 6.0, 97),
                   torch.tensor([-1e6, -1e3, -100.0, -30.0, -10.0, -7.0, 6.5, 7.0, 8.0, 10.0, 10.5,
                                 12.0, 20.0, 30.0, 100.0, 1e3, 1e6])])
    try:
        with torch.no_grad():
            y = fn(x)
    except Exception:  # noqa: BLE001 (not an elementwise function of one tensor)
        return None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        return None
    for name, ref in (("gelu", lambda t: nn.functional.gelu(t)),
                      ("gelu_tanh", lambda t: nn.functional.gelu(t, approximate="tanh")),
                      ("relu", nn.functional.relu)):
        r = ref(x)
        if bool(((y.float() - r).abs() <= 1e-5 * r.abs().clamp(min=1.0)).all()):
            return name
    return None


def _module(**children):
    m = nn.Module()
    for k, v in children.items():
        setattr(m, k, v)
    return m


class _Token:
    """Alive while a forward's autograd node (which may still run backward) is."""


# DLPack (dlpack.h, v0.8): dmove's device buffers as torch tensors without a copy
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    pass


# deleter NULL: the memory is the dmove layer's, nothing to free (torch calls none then)
_DLManaged._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]
# every struct torch was given, kept for the life of the process: torch reads it when a view
# dies, which may be after its core (a traceback's frame holding one), even at exit; some
# 150 bytes a buffer of a layer shape made
_DL_KEEP = []
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# dm_dtype -> DLPack (code, bits) and torch's dtype
_DL_TYPES = {0: (2, 32, torch.float32), 1: (4, 16, torch.bfloat16), 2: (2, 16, torch.float16)}
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _dl_view(ptr, dims, dtype, device):
    """A torch tensor over dims elements of dm_dtype dtype at ptr on device (torch.device)."""
    code, bits, _ = _DL_TYPES[dtype]
    shape = (ctypes.c_int64 * len(dims))(*dims)
    m = _DLManaged()
    m.dl_tensor.data = ptr
    m.dl_tensor.device = _DLDevice(2 if device.type == "cuda" else 1,
                                   (device.index or 0) if device.type == "cuda" else 0)
    m.dl_tensor.ndim = len(dims)
    m.dl_tensor.dtype = _DLDataType(code, bits, 1)
    m.dl_tensor.shape = shape
    m.dl_tensor.strides = None  # dense, row-major
    m.deleter = None
    _DL_KEEP.append((m, shape))
    return torch.utils.dlpack.from_dlpack(_capsule_new(ctypes.addressof(m), b"dltensor", None))


class _Shape(list):
    """The cores of one shape; peak: the most pending at once in this round of forwards,
    last: in the one before (a round starts when none is pending)."""
    peak = 0
    last = 1


class _Core:
    """One dmove layer (dm_layer) of one (batch, seq) shape and its buffers as tensors.

    device None: dmove's CPU backend, its host buffers as tensors (t). Else (torch.device,
    storage dtype): dmove's CUDA backend, whose buffers on the GPU are tensors (d) on that
    device, written and read there without a copy to the host (a CPU device: the CUDA
    build's host emulation, DMOVE_CUDA_EMULATE=1, for tests)."""

    def __init__(self, settings, batch, seq, threads, unpad=False, device=None):
        hidden, heads, ffn, p, eps, act = settings
        cfg = _lib.LayerConfig()
        lib.dm_layer_config_default(ctypes.byref(cfg))
        cfg.batch, cfg.seq, cfg.hidden, cfg.heads, cfg.ffn = batch, seq, hidden, heads, ffn
        # p runs only in training, where BertLayer refuses p = 1; a model held in eval() with
        # p = 1 (transformers takes it) gets a layer that runs no dropout
        cfg.dropout, cfg.eps, cfg.act = (p if p < 1 else 0.0), eps, _lib.ACT[act]
        opt = _lib.LayerOptions()  # zeros: fused, CPU, fp32, default rows/streams
        opt.threads = threads
        opt.unpad = 1 if unpad else 0
        if device is not None:
            opt.device = _lib.DEVICE_CUDA
            opt.dtype = _DTYPE_CODES[device[1]]
        self.unpad = bool(unpad)
        h = ctypes.c_void_p()
        with _on(device):
            check(lib.dm_layer_new(ctypes.byref(h), ctypes.byref(cfg), ctypes.byref(opt)),
                  f"dmove layer b={batch} j={seq} hidden={hidden} heads={heads} ffn={ffn}")
        self.h = h
        self.free = lib.dm_layer_free
        self.names = [lib.dm_layer_param_name(h, k).decode()
                      for k in range(lib.dm_layer_num_params(h))]
        self.t = {}
        # plain tensors whatever mode the first call runs in (views made under
        # inference_mode could not be written by a later call outside it)
        with torch.inference_mode(False), torch.no_grad():
            for n in ["hidden_states", "seq_lengths" if unpad else "attention_mask", "output",
                      "grad_output", "grad_hidden_states"] + self.names + \
                    [n + ".grad" for n in self.names]:
                self.t[n] = self._view(n)
            self.device = device
            self.d = self.t  # where the step's data is: the host's buffers, or the device's
            if device is not None:
                self.d = {}
                for n, v in self.t.items():
                    ptr, dt = ctypes.c_void_p(), ctypes.c_int()
                    check(lib.dm_layer_device_tensor(h, n.encode(), ctypes.byref(ptr), ctypes.byref(dt)),
                          f"dmove layer tensor {n} on the device")
                    self.d[n] = _dl_view(ptr.value, list(v.shape), dt.value, device[0])
        self.training = 1
        self.token = None
        self.mask_ones = False
        self.lock = threading.Lock()  # one call at a time on its buffers (ctypes drops the GIL)
        self.reserved = False  # handed to a call by _acquire, until its forward ends

    def _view(self, name):
        ptr = ctypes.POINTER(ctypes.c_float)()
        nd = ctypes.c_int()
        shape = (ctypes.c_int64 * 4)()
        check(lib.dm_layer_tensor(self.h, name.encode(), ctypes.byref(ptr), ctypes.byref(nd),
                                  shape), f"dmove layer tensor {name}")
        dims = [shape[k] for k in range(nd.value)]
        n = math.prod(dims)
        buf = (ctypes.c_float * n).from_address(ctypes.addressof(ptr.contents))
        return torch.frombuffer(buf, dtype=torch.float32).view(dims)  # keeps buf alive

    def busy(self):
        return self.reserved or (self.token is not None and self.token() is not None)

    def __del__(self):
        if getattr(self, "h", None):
            self.free(self.h)
            self.h = None


class _LayerFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, core, hidden, mask, training, seed, want_grad, *params):
        try:
            with core.lock:
                return _LayerFn._forward(ctx, core, hidden, mask, training, seed, want_grad, params)
        finally:
            core.reserved = False  # busy now while its backward may come (the token)

    @staticmethod
    def _forward(ctx, core, hidden, mask, training, seed, want_grad, params):
        t = core.d  # the host's buffers, or the GPU's
        ctx.sel = None
        if core.unpad:  # the real tokens packed from row 0, the lengths
            sel = mask.bool()
            packed = hidden[sel]
            t["hidden_states"].view(-1, hidden.shape[2])[:packed.shape[0]].copy_(packed)
            core.t["seq_lengths"].copy_(mask.sum(1))  # the host's copy sets the step's rows
            if core.device is not None:
                check(lib.dm_layer_tensor_to_device(core.h, b"seq_lengths"), "dmove seq_lengths")
            _copies["hidden_in"] += packed.numel() * t["hidden_states"].element_size()
            _copies["mask_in"] += mask.shape[0] * 4  # the host copy (fp32), then sent up
            ctx.sel = sel
        else:
            t["hidden_states"].copy_(hidden)
            _copies["hidden_in"] += hidden.numel() * t["hidden_states"].element_size()
            if mask is None:
                if not core.mask_ones:
                    t["attention_mask"].fill_(1.0)
                    core.mask_ones = True
            else:
                t["attention_mask"].copy_(mask)
                core.mask_ones = False
                _copies["mask_in"] += mask.numel() * t["attention_mask"].element_size()
        # every parameter, every call: optimizers that update in place without a version
        # bump (fused=True, the Trainer's default adamw_torch_fused; writes through .data)
        # would otherwise leave dmove on stale weights; about 1% of a BERT-base layer's step
        for k, p in enumerate(params):
            t[core.names[k]].copy_(p.detach())
            _copies["params_in"] += p.numel() * t[core.names[k]].element_size()
        ctx.param_dtypes = [p.dtype for p in params]
        _device_wait(core)
        with _on(core.device):
            if core.training != training:
                check(lib.dm_layer_set_training(core.h, training), "dm_layer_set_training")
                core.training = training
            if training:
                check(lib.dm_layer_set_seed(core.h, seed), "dm_layer_set_seed")
            check(lib.dm_layer_forward(core.h), "dm_layer_forward")
        _calls["forward"] += 1
        if ctx.sel is not None:  # back at the real positions; 0 at the padded ones
            out = hidden.new_zeros(hidden.shape)
            n = int(ctx.sel.sum())
            out[ctx.sel] = t["output"].view(-1, hidden.shape[2])[:n].to(out.dtype)
            _copies["output_out"] += n * hidden.shape[2] * t["output"].element_size()
        else:
            out = t["output"].to(hidden.dtype, copy=True)
            _copies["output_out"] += out.numel() * t["output"].element_size()
        ctx.core = core
        if want_grad:
            tok = _Token()
            core.token = weakref.ref(tok)
            ctx.tok = tok
        else:
            ctx.tok = None
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        with ctx.core.lock:
            return _LayerFn._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        core, tok = ctx.core, ctx.tok
        if tok is None or core.token is None or core.token() is not tok:
            raise Error("dmove.torch.BertLayer: backward through a layer call whose saved state "
                        "is gone (a second backward through the same graph, retain_graph=True, "
                        "is not supported)")
        t = core.d
        sel = ctx.sel
        if sel is not None:
            g = grad_out[sel]
            t["grad_output"].view(-1, grad_out.shape[2])[:g.shape[0]].copy_(g)
            _copies["grad_output_in"] += g.numel() * t["grad_output"].element_size()
        else:
            t["grad_output"].copy_(grad_out)
            _copies["grad_output_in"] += grad_out.numel() * t["grad_output"].element_size()
        _device_wait(core)
        with _on(core.device):
            check(lib.dm_layer_backward(core.h), "dm_layer_backward")
        _calls["backward"] += 1
        gh = None
        if ctx.needs_input_grad[1] and sel is not None:
            gh = grad_out.new_zeros(grad_out.shape)
            n = int(sel.sum())
            gh[sel] = t["grad_hidden_states"].view(-1, grad_out.shape[2])[:n].to(gh.dtype)
            _copies["grad_input_out"] += n * grad_out.shape[2] * t["grad_hidden_states"].element_size()
        elif ctx.needs_input_grad[1]:
            gh = t["grad_hidden_states"].to(grad_out.dtype, copy=True)
            _copies["grad_input_out"] += gh.numel() * t["grad_hidden_states"].element_size()
        grads = []
        for k, n in enumerate(core.names):
            if ctx.needs_input_grad[6 + k]:
                g = t[n + ".grad"].to(ctx.param_dtypes[k], copy=True)
                _copies["param_grads_out"] += g.numel() * t[n + ".grad"].element_size()
                grads.append(g)
            else:
                grads.append(None)
        core.token = None
        ctx.tok = None
        ctx.sel = None
        return (None, gh, None, None, None, None, *grads)


def _mask01(mask, b, j, device):
    """transformers' attention mask for a layer as dmove's (b, j) float 1/0, or None (all
    tokens), on the hidden states' device. Refuses masks that are not one padding mask for
    every query."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"dmove.torch.BertLayer: attention_mask must be a tensor or None, "
                        f"not {type(mask).__name__}" + (" (flex_attention's: load the model with "
                        "attn_implementation='sdpa' or 'eager')" if type(mask).__name__ == "BlockMask" else ""))
    if mask.device != device:
        raise ValueError(f"dmove.torch.BertLayer: attention_mask on {mask.device}, hidden_states "
                         f"on {device}: give both on one device")
    if mask.dim() == 2:
        if tuple(mask.shape) != (b, j):
            raise ValueError(f"dmove.torch.BertLayer: attention_mask of shape "
                             f"{tuple(mask.shape)}: expected ({b}, {j})")
        ok = mask.bool() if mask.dtype == torch.bool else (mask != 0)
        if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("dmove.torch.BertLayer: a (batch, seq) attention_mask must hold "
                             "1 (token) and 0 (padding)")
        return ok.to(torch.float32)
    if mask.dim() != 4 or mask.shape[0] not in (1, b) or mask.shape[1] != 1 \
            or mask.shape[2] not in (1, j) or mask.shape[3] != j:
        raise ValueError(f"dmove.torch.BertLayer: attention_mask of shape {tuple(mask.shape)}: "
                         f"dmove takes None, ({b}, {j}), ({b}, 1, 1, {j}) or ({b}, 1, {j}, {j})")
    if mask.dtype == torch.bool:
        ok = mask
    elif mask.is_floating_point():
        # additive: 0 for a key attended, a large negative number for one masked
        big = mask <= -1e4
        if not bool(((mask == 0) | big).all()):
            raise ValueError("dmove.torch.BertLayer: an additive attention_mask must hold 0 "
                             "and large negative numbers only (a padding mask); dmove takes "
                             "no other attention bias")
        ok = ~big
    else:
        raise TypeError(f"dmove.torch.BertLayer: attention_mask of dtype {mask.dtype}: "
                        "dmove takes bool or float masks")
    ok = ok[:, 0]                      # (b|1, 1|j, j)
    if ok.shape[1] != 1 and not bool((ok == ok[:, :1]).all()):
        raise ValueError("dmove.torch.BertLayer: this attention_mask differs between queries "
                         "(causal or custom attention): dmove takes a padding mask, the same "
                         "keys for every query")
    return ok[:, 0].expand(b, j).to(torch.float32)


class BertLayer(nn.Module):
    """transformers' BertLayer (post-LN encoder layer) run by dmove.

    BertLayer(config): new parameters (BERT's initialisation: N(0, initializer_range),
    biases 0, LayerNorm 1) under transformers' names. BertLayer(config, layer=hf_layer):
    the submodules (and so the Parameter objects) of a transformers BertLayer.
    forward(hidden_states, attention_mask=None, ...) returns the layer's output tensor, as
    transformers' BertLayer does. unpad=True: a batch padded at the ends of its sequences
    runs on the real tokens alone, its output 0 at the padded positions (the module's doc).
    """

    def __init__(self, config, layer=None, unpad=False, dmove_device=None):
        nn.Module.__init__(self)  # not a transformers BertLayer's own __init__ (patch's class)
        self._unpad = bool(unpad)
        if dmove_device not in (None, "cuda"):
            raise ValueError(f"dmove.torch.BertLayer: dmove_device={dmove_device!r}: None (follow "
                             "the tensors) or 'cuda'")
        self._dmove_device = dmove_device
        if layer is not None and hasattr(layer, "crossattention"):
            raise ValueError("dmove.torch.BertLayer: a layer with cross-attention (a decoder's) is "
                             "not taken: dmove's layer is an encoder layer")
        # the layer's own config where it keeps one (the encoder's in an EncoderDecoderModel,
        # whose top config has no sizes)
        own = getattr(getattr(getattr(layer, "attention", None), "self", None), "config", None)
        if own is not None and getattr(own, "hidden_size", None) is not None:
            config = own
        self._settings = _layer_settings(config)  # the config's; the submodules' after they are made
        hidden, heads, ffn, p, eps, act = self._settings
        if layer is not None:
            self.attention = layer.attention
            self.intermediate = layer.intermediate
            self.output = layer.output
            self.train(layer.training)
        else:
            lin = lambda i, o: nn.Linear(i, o)
            self.attention = _module(
                self=_module(query=lin(hidden, hidden), key=lin(hidden, hidden),
                             value=lin(hidden, hidden)),
                output=_module(dense=lin(hidden, hidden), LayerNorm=nn.LayerNorm(hidden, eps=eps)))
            self.intermediate = _module(dense=lin(hidden, ffn))
            self.output = _module(dense=lin(ffn, hidden), LayerNorm=nn.LayerNorm(hidden, eps=eps),
                                  dropout=nn.Dropout(p))
            # as transformers' (no parameters): their p is what the layer runs with
            self.attention.self.dropout = nn.Dropout(float(getattr(config, "attention_probs_dropout_prob", p)))
            self.attention.output.dropout = nn.Dropout(p)
            std = float(getattr(config, "initializer_range", 0.02))
            with torch.no_grad():
                for name, prm in self.named_parameters():
                    if "LayerNorm.weight" in name:
                        prm.fill_(1.0)
                    elif name.endswith("bias"):
                        prm.zero_()
                    else:
                        prm.normal_(0.0, std)
        # the config whose output_attentions transformers reads: the layer's own if it has one
        self._config = getattr(getattr(getattr(layer, "attention", None), "self", None), "config", config)
        self._acts = (None, None)  # the activation module last told apart, and its name
        self._cores = {}     # (batch, seq, threads) -> [_Core], the latest used last
        self._names = None   # dmove's parameter names, in its order
        self._lock = threading.Lock()  # the cores' bookkeeping, across threads
        self._settings = self._live_settings()

    def _live_settings(self):
        """(hidden, heads, ffn, dropout, eps, act) as the submodules hold them now: a config
        changed after the layer was made (Dropout.p set to 0 for fine-tuning, LayerNorm.eps, a
        wrapped layer of other sizes than the model's config) is what runs, as in torch."""
        hidden, heads, ffn, p, eps, act = self._settings
        sa = self.attention.self
        subs = (("attention.self.query", sa.query, nn.Linear), ("attention.self.key", sa.key, nn.Linear),
                ("attention.self.value", sa.value, nn.Linear),
                ("attention.output.dense", self.attention.output.dense, nn.Linear),
                ("attention.output.LayerNorm", self.attention.output.LayerNorm, nn.LayerNorm),
                ("intermediate.dense", self.intermediate.dense, nn.Linear),
                ("output.dense", self.output.dense, nn.Linear), ("output.LayerNorm", self.output.LayerNorm, nn.LayerNorm))
        for name, mod, want in subs:  # every call: what replaces them later (an adapter) is seen too
            if not isinstance(mod, want) or type(mod).forward is not want.forward:
                raise TypeError(f"dmove.torch.BertLayer: {name} is a {type(mod).__name__}, not an "
                                f"nn.{want.__name__} running nn.{want.__name__}'s forward: dmove's layer "
                                "runs its weights as that forward does, so what the module adds (an adapter "
                                "such as LoRA, quantization) would be skipped: use the unpatched layer")
            if mod._forward_hooks or mod._forward_pre_hooks:
                raise ValueError(f"dmove.torch.BertLayer: {name} has forward hooks, which dmove's fused "
                                 "layer would not run (it never calls the submodule): remove them, or "
                                 "hook the layer itself")
        hidden = int(sa.query.in_features)
        if int(sa.query.out_features) != hidden:
            raise ValueError(f"dmove.torch.BertLayer: the query projection maps {hidden} to "
                             f"{sa.query.out_features} features: dmove's heads span the hidden size")
        heads = int(getattr(sa, "num_attention_heads", heads))
        if heads < 1 or hidden % heads:
            raise ValueError(f"dmove.torch.BertLayer: hidden size {hidden} is not a multiple of "
                             f"{heads} heads")
        scaling = getattr(sa, "scaling", None)  # transformers' 1 / sqrt(head size), dmove's alpha
        if scaling is not None and abs(float(scaling) * math.sqrt(hidden // heads) - 1.0) > 1e-6:
            raise ValueError(f"dmove.torch.BertLayer: attention.self.scaling is {float(scaling)}, not "
                             f"1/sqrt({hidden // heads}) (the head size): dmove's layer scales the scores "
                             "by that alone")
        ffn = int(self.intermediate.dense.out_features)
        e1, e2 = float(self.attention.output.LayerNorm.eps), float(self.output.LayerNorm.eps)
        if e1 != e2:
            raise ValueError(f"dmove.torch.BertLayer: the two LayerNorms' eps differ ({e1}, {e2}): "
                             "dmove's layer has one")
        run = self._dropouts_run()
        self._dropout_on = any(q > 0 for q in run)
        if self._dropout_on:
            if any(q != run[0] for q in run):
                raise ValueError(f"dmove.torch.BertLayer: the layer's dropouts differ as they run now "
                                 f"({run}: attention probabilities, attention output, output; a "
                                 "Dropout in eval() or replaced runs with 0): dmove's layer has one "
                                 "dropout probability for its three dropouts")
            p = run[0]  # 1 is refused by the call that would run it (forward)
        fn = getattr(self.intermediate, "intermediate_act_fn", None)
        if fn is not None:
            if self._acts[0] is not fn:
                self._acts = (fn, _act_of(fn))
            if self._acts[1] is None:
                raise ValueError(f"dmove.torch.BertLayer: the layer's activation {type(fn).__name__} "
                                 "is none of gelu, gelu_new (tanh) and relu, which dmove runs")
            act = self._acts[1]
        return (hidden, heads, ffn, p, e1, act)

    def _dropouts_run(self):
        """The probability each of the layer's three dropouts runs with now, as transformers
        runs them: the attention probabilities' at the attention module's p while that module
        trains (its Dropout's own mode must agree: transformers' versions differ on which
        decides); the attention output's and the output's at their Dropout's p while that
        Dropout trains, 0 where it is replaced by nn.Identity; any other module there is
        refused."""
        sa = self.attention.self
        d0 = getattr(sa, "dropout", None)
        if d0 is None or isinstance(d0, nn.Identity):
            q0 = 0.0
        elif isinstance(d0, nn.Dropout):
            if d0.training != sa.training:
                raise ValueError("dmove.torch.BertLayer: the attention's Dropout is in "
                                 f"{'train' if d0.training else 'eval'} mode and its attention module "
                                 f"in {'train' if sa.training else 'eval'} mode: transformers' versions "
                                 "differ on which decides; set both alike")
            q0 = float(d0.p) if sa.training else 0.0
        else:
            raise ValueError(f"dmove.torch.BertLayer: the attention's dropout is a "
                             f"{type(d0).__name__}: dmove's layer runs nn.Dropout (or nn.Identity)")
        run = [q0]
        for where, m in (("attention output", self.attention.output), ("output", self.output)):
            d = getattr(m, "dropout", None)
            if d is None or isinstance(d, nn.Identity):
                run.append(0.0)
            elif isinstance(d, nn.Dropout):
                run.append(float(d.p) if d.training else 0.0)
            else:
                raise ValueError(f"dmove.torch.BertLayer: the {where}'s dropout is a "
                                 f"{type(d).__name__}: dmove's layer runs nn.Dropout (or nn.Identity)")
        return run

    def extra_repr(self):
        hidden, heads, ffn, p, eps, act = self._settings
        return f"dmove: hidden={hidden} heads={heads} ffn={ffn} dropout={p} eps={eps} act={act}"

    def __getstate__(self):
        # a dmove layer is not copied (deepcopy, pickling, torch.save of the module): the
        # copy makes its own at its first call
        state = self.__dict__.copy()
        state["_cores"] = {}
        state["_lock"] = None
        state["_acts"] = (None, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("_unpad", False)  # pickled before unpad existed
        self.__dict__.setdefault("_dmove_device", None)
        self.__dict__.setdefault("_config", None)
        self.__dict__.setdefault("_acts", (None, None))
        self._lock = threading.Lock()

    def _acquire(self, b, j, unpad=False, device=None):
        with self._lock:
            return self._acquire_locked(b, j, unpad, device)

    def _acquire_locked(self, b, j, unpad, device):
        key = (b, j, get_num_threads(), unpad, device)
        cores = self._cores.pop(key, None)  # back in as the latest used: the oldest shape goes first
        if cores is not None:
            self._cores[key] = cores
        if cores is None:
            # forget shapes with nothing pending, the oldest first, until there is room
            for k, cs in list(self._cores.items()):
                if len(self._cores) < _MAX_SHAPES:
                    break
                if not any(c.busy() for c in cs):
                    del self._cores[k]
            cores = self._cores[key] = _Shape()
        idle = [c for c in cores if not c.busy()]
        if len(idle) == len(cores):
            # a new round of forwards: as many cores are kept as the last round had pending at
            # once (gradient accumulation's micro-batches), the others' memory let go
            cores.last, cores.peak = max(cores.peak, 1), 0
            del cores[cores.last:], idle[cores.last:]
        if idle:
            idle[0].reserved = True
            cores.peak = max(cores.peak, len(cores) - len(idle) + 1)
            return idle[0]
        if len(cores) >= _MAX_PENDING:
            raise Error(f"dmove.torch.BertLayer: {len(cores)} forwards of this layer are waiting "
                        "for their backward; run backward (or drop their outputs) first")
        c = _Core(self._settings, b, j, key[2], unpad, device)
        if self._names is None:
            # (weights tied inside the layer: each name, the same Parameter's gradient summed)
            own = dict(self.named_parameters(remove_duplicate=False))
            missing = [n for n in c.names if n not in own]
            if missing:
                raise ValueError(f"dmove.torch.BertLayer: the module lacks dmove's parameters "
                                 f"{missing} as nn.Parameters (replaced by pruning, weight_norm or "
                                 "functional_call?): dmove's layer takes its submodules' own")
            self._names = c.names
        c.reserved = True
        cores.append(c)
        cores.peak = max(cores.peak, len(cores))
        return c

    def forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None,
                encoder_attention_mask=None, cache=None, past_key_values=None,
                output_attentions=False, head_mask=None, **kwargs):
        if encoder_hidden_states is not None or encoder_attention_mask is not None:
            raise ValueError("dmove.torch.BertLayer: cross-attention (encoder_hidden_states) "
                             "is not taken: dmove's layer is an encoder layer")
        if cache is not None or past_key_values is not None or kwargs.get("use_cache"):
            raise ValueError("dmove.torch.BertLayer: a key/value cache (cache, past_key_values, "
                             "use_cache) is not taken")
        if output_attentions or kwargs.get("output_attentions"):
            raise ValueError("dmove.torch.BertLayer: output_attentions=True is not taken: "
                             "dmove's fused layer does not return the attention probabilities")
        if head_mask is not None:
            raise ValueError("dmove.torch.BertLayer: head_mask is not taken")
        if getattr(self._config, "output_attentions", False):
            raise ValueError("dmove.torch.BertLayer: the config's output_attentions is true: dmove's "
                             "fused layer does not form the attention probabilities as a tensor "
                             "(set config.output_attentions = False, or leave the model unpatched)")
        settings = self._live_settings()
        if settings != self._settings:  # the submodules changed: layers made again for them
            with self._lock:
                self._settings, self._cores = settings, {}
        x = hidden_states
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"dmove.torch.BertLayer: hidden_states must be a tensor, "
                            f"not {type(x).__name__}")
        device = None  # dmove's CPU backend, or (torch device, storage dtype) for its CUDA one
        if x.device.type == "cuda" or self._dmove_device == "cuda":
            sdt = x.dtype
            if x.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
                sdt = torch.get_autocast_dtype("cuda")
            if sdt not in _DTYPE_CODES:
                raise TypeError(f"dmove.torch.BertLayer: hidden_states of dtype {sdt} on {x.device}: "
                                "dmove takes float32, bfloat16 or float16 there")
            device = (x.device, sdt)
            # the CUDA build runs on the GPU, or (DMOVE_CUDA_EMULATE) on the host: its buffers
            # are the tensors' device's memory only in the matching case
            emulated = os.environ.get("DMOVE_CUDA_EMULATE", "0") not in ("", "0")
            if x.device.type == "cuda" and emulated:
                raise ValueError("dmove.torch.BertLayer: DMOVE_CUDA_EMULATE is set, so dmove's CUDA "
                                 "backend runs on the host: unset it for GPU tensors")
            if x.device.type != "cuda" and not emulated:
                raise ValueError("dmove.torch.BertLayer: dmove_device='cuda' with CPU tensors runs in "
                                 "the CUDA build's host emulation alone (DMOVE_CUDA_EMULATE=1, for "
                                 "tests): give GPU tensors")
        elif x.device.type != "cpu":
            raise ValueError(f"dmove.torch.BertLayer: hidden_states on {x.device}: dmove runs on "
                             "the CPU and on CUDA GPUs")
        elif x.dtype != torch.float32:
            raise TypeError(f"dmove.torch.BertLayer: hidden_states of dtype {x.dtype}: dmove's "
                            "CPU backend takes torch.float32 (model.float())")
        hidden = self._settings[0]
        if x.dim() != 3 or x.shape[2] != hidden:
            raise ValueError(f"dmove.torch.BertLayer: hidden_states of shape {tuple(x.shape)}: "
                             f"expected (batch, seq, {hidden})")
        b, j = int(x.shape[0]), int(x.shape[1])
        if b == 0 or j == 0:
            raise ValueError(f"dmove.torch.BertLayer: empty hidden_states {tuple(x.shape)}")
        mask = _mask01(attention_mask, b, j, x.device)
        unpad = False
        if self._unpad and mask is not None:  # padding, and only at the ends of the sequences
            lengths = mask.sum(1)
            unpad = bool((lengths < j).any()) and bool(
                (mask == (torch.arange(j, device=mask.device) < lengths[:, None]).to(mask.dtype)).all()) and \
                bool((lengths > 0).any())
        for n, prm in self.named_parameters():  # before a layer is made for the call
            if device is None and (prm.dtype != torch.float32 or prm.device.type != "cpu"):
                raise TypeError(f"dmove.torch.BertLayer: parameter {n} is {prm.dtype} on "
                                f"{prm.device}: dmove takes float32 on the CPU")
            if device is not None and (prm.dtype not in _DTYPE_CODES or prm.device != x.device):
                raise TypeError(f"dmove.torch.BertLayer: parameter {n} is {prm.dtype} on "
                                f"{prm.device}: with hidden_states on {x.device}, dmove takes "
                                "float32, bfloat16 or float16 parameters there")
        core = self._acquire(b, j, unpad, device)
        try:
            try:
                params = [self.get_parameter(n) for n in self._names]
            except AttributeError as e:
                raise TypeError(f"dmove.torch.BertLayer: {e}: dmove's layer takes its weights as the "
                                "nn.Parameters of its Linear and LayerNorm submodules; what replaces "
                                "them by other tensors (torch.func.functional_call, pruning, "
                                "weight_norm) is not followed: use the unpatched layer for it") from None
            training = 1 if self._dropout_on else 0  # as the Dropout modules run (_live_settings)
            if training and self._settings[3] >= 1:
                raise ValueError("dmove.torch.BertLayer: dropout probability 1 in training: dmove's "
                                 "layer takes probabilities in [0, 1)")
            seed = int(torch.randint(0, 2**62, (1,)).item()) if training else 0
            want_grad = torch.is_grad_enabled() and (x.requires_grad or
                                                     any(p.requires_grad for p in params))
        except BaseException:
            core.reserved = False  # not called: the core is free again
            raise
        return _LayerFn.apply(core, x, mask, training, seed, want_grad, *params)


try:
    # torch.compile runs dmove's layer as it is (a call into the library): not traced into,
    # whose bookkeeping (the layers kept per shape) would only recompile its graphs
    BertLayer.forward = torch.compiler.disable(BertLayer.forward)
except Exception:  # noqa: BLE001 (a torch without torch.compiler: nothing to keep out of)
    pass

_classes = {}  # transformers' BertLayer class -> dmove's layer class that is one too


def _layer_class(hf_cls):
    """dmove's BertLayer as a subclass of transformers' BertLayer class as well: the model
    then sees its own kind of layer, so output_hidden_states records each layer's output
    (transformers hooks the modules of that class) and gradient_checkpointing_enable()
    checkpoints them (its GradientCheckpointingLayer wraps the forward). The forward is
    dmove's. Registered under a module-level name, so torch.save of a model pickles."""
    c = _classes.get(hf_cls)
    if c is None:
        name = "_PatchedBertLayer_" + "".join(ch if ch.isalnum() else "_" for ch in hf_cls.__module__)
        try:
            c = type(name, (BertLayer, hf_cls), {"__module__": __name__, "__doc__": BertLayer.__doc__})
            c.__name__ = "BertLayer"  # what tools that match layers by name see; pickled by __qualname__
        except TypeError:  # a transformers whose BertLayer cannot be a base: dmove's alone
            c = BertLayer
        globals()[name] = c
        _classes[hf_cls] = c
    return c


def __getattr__(name):
    # a patched model unpickled in a process that has not patched yet: its layer class
    if name.startswith("_PatchedBertLayer_"):
        from transformers.models.bert.modeling_bert import BertLayer as HFBertLayer
        c = _layer_class(HFBertLayer)
        if c.__qualname__ == name:
            return c
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def patch(model, unpad=False):
    """Replaces every transformers BertLayer in `model` by a dmove BertLayer sharing its
    parameters (state_dict keys unchanged); returns the model. Refuses (ValueError) a model
    without one, or a config dmove's layer cannot run. unpad=True: padded batches run on
    their real tokens alone (BertLayer's unpad)."""
    from transformers.models.bert.modeling_bert import BertLayer as HFBertLayer
    config = getattr(model, "config", None)
    found = []
    for name, mod in model.named_modules():
        for cname, child in mod.named_children():
            if isinstance(child, HFBertLayer) and not isinstance(child, BertLayer):
                found.append((mod, cname, child))
    mine = [m for m in model.modules() if isinstance(m, BertLayer)]
    if not found and mine:  # patched already: only unpad may change
        for m in mine:
            m._unpad = bool(unpad)
        return model
    if not found:
        raise ValueError("dmove.torch.patch: no transformers BertLayer in this model")
    configs = [config if config is not None else getattr(child.attention.self, "config", None)
               for _, _, child in found]  # a module holding a model: its layers' own
    if any(c is None for c in configs):
        raise ValueError("dmove.torch.patch: the model has no .config, nor do its BertLayers: pass the "
                         "transformers model itself (patch(module.bert) for a module holding one)")
    cls = _layer_class(HFBertLayer)
    made = [cls(c, layer=child, unpad=unpad) for c, (_, _, child) in zip(configs, found)]  # all, or none
    for (parent, cname, child), new in zip(found, made):
        if getattr(child, "gradient_checkpointing", False):  # enabled before the patch
            new.gradient_checkpointing = True
            new._gradient_checkpointing_func = child._gradient_checkpointing_func
        setattr(parent, cname, new)
    # transformers hooks the modules that record outputs (hidden states) once per model:
    # hooks made before the patch sit on the layers it replaced, so they are made again
    for mod in model.modules():
        if getattr(mod, "_output_capturing_hooks_installed", False):
            mod._output_capturing_hooks_installed = False
    return model
