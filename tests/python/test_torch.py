"""dmove.torch against transformers: tests/test_python.sh runs these (make test)."""
import copy
import io
import subprocess
import sys
import ctypes

import pytest
import torch
from transformers import (BertConfig, BertForMaskedLM, BertForSequenceClassification,
                          BertModel)

import dmove
import dmove.torch as dt
from dmove import _lib

B, J = 3, 16


def tiny_config(dropout=0.0, **kw):
    return BertConfig(vocab_size=100, hidden_size=32, num_attention_heads=2,
                      intermediate_size=64, num_hidden_layers=2, max_position_embeddings=32,
                      hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, **kw)


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 100, (B, J), generator=g)
    mask = torch.ones(B, J, dtype=torch.long)
    mask[1, 11:] = 0
    mask[2, 5:] = 0
    labels = torch.where(torch.rand(B, J, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    labels[0, 0] = ids[0, 0]
    return ids, mask, labels


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def grads_agree(m1, m2, tol=1e-5):
    n = 0
    for (k1, p1), (k2, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        assert k1 == k2
        if p2.grad is None:
            assert p1.grad is None, k1
            continue
        assert p1.grad is not None, k1
        if k1.endswith("attention.self.key.bias"):
            # zero in exact arithmetic (softmax does not change when a query's scores all
            # move by the same amount): both are rounding noise, compared absolutely
            assert float(p1.grad.abs().max()) < 1e-9 and float(p2.grad.abs().max()) < 1e-9
            continue
        assert rel(p1.grad, p2.grad) <= tol, (k1, rel(p1.grad, p2.grad))
        n += 1
    return n


def same_step(ref, pat, **inputs):
    """One forward and backward of both models on the inputs: the losses within 1e-5 and
    every gradient as grads_agree checks them."""
    l_ref = ref(**inputs).loss
    l_pat = pat(**inputs).loss
    assert rel(l_pat, l_ref) <= 1e-5
    l_ref.backward()
    l_pat.backward()
    assert grads_agree(pat, ref) > 20


def test_struct_sizes():
    # include/dmove.h: dm_layer_config 5 int64, 2 double, act, seed, norm, causal
    assert ctypes.sizeof(_lib.LayerConfig) == 5 * 8 + 2 * 8 + 8 + 8 + 8
    cfg = _lib.LayerConfig()
    _lib.lib.dm_layer_config_default(ctypes.byref(cfg))
    assert (cfg.batch, cfg.seq, cfg.hidden, cfg.heads, cfg.ffn) == (8, 128, 768, 12, 3072)
    assert abs(cfg.dropout - 0.1) < 1e-12 and abs(cfg.eps - 1e-12) < 1e-20
    assert (cfg.act, cfg.seed, cfg.norm, cfg.causal) == (0, 0, 0, 0)
    # dm_layer_options: 10 ints, a pointer (8-aligned after 4 ints), 2 ints
    assert ctypes.sizeof(_lib.LayerOptions) == 4 * 4 + 8 + 8 * 4


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_masked_lm_equals_unpatched(attn):
    torch.manual_seed(0)
    ref = BertForMaskedLM(tiny_config(attn_implementation=attn)).train()
    pat = dt.patch(copy.deepcopy(ref))
    assert sum(isinstance(m, dt.BertLayer) for m in pat.modules()) == 2
    ids, mask, labels = batch()
    same_step(ref, pat, input_ids=ids, attention_mask=mask, labels=labels)


def test_unpad_equals_unpatched():
    # padding at the ends of the sequences, no label on it (as transformers' collators make
    # batches): the unpadded layers give the same loss and gradients, 0 at padded positions
    torch.manual_seed(3)
    ref = BertForMaskedLM(tiny_config())
    pat = dt.patch(copy.deepcopy(ref), unpad=True)
    ids, mask, labels = batch()
    labels = labels.masked_fill(mask == 0, -100)
    dt.reset_copy_stats()
    same_step(ref, pat, input_ids=ids, attention_mask=mask, labels=labels)
    st = dt.copy_stats()
    assert st["hidden_in"] == 2 * int(mask.sum()) * 32 * 4  # the real tokens alone, 2 layers
    layer = pat.bert.encoder.layer[0]
    x = torch.randn(B, J, 32)
    y = layer(x, attention_mask=mask)
    want = ref.bert.encoder.layer[0](x, attention_mask=(1.0 - mask[:, None, None, :].float()) * -1e9)
    want = want[0] if isinstance(want, tuple) else want
    sel = mask.bool()
    assert rel(y[sel], want[sel]) <= 1e-5 and bool((y[~sel] == 0).all())
    # padding inside a sequence: not unpadded, the padded layer runs (HF's outputs there)
    holes = mask.clone()
    holes[0, 3] = 0
    y2 = layer(x, attention_mask=holes)
    want2 = ref.bert.encoder.layer[0](x, attention_mask=(1.0 - holes[:, None, None, :].float()) * -1e9)
    want2 = want2[0] if isinstance(want2, tuple) else want2
    assert rel(y2, want2) <= 1e-5


def test_output_hidden_states_and_gradient_checkpointing(tmp_path):
    torch.manual_seed(5)
    ref = BertForMaskedLM(tiny_config())
    pat = dt.patch(copy.deepcopy(ref))
    ids, mask, labels = batch()
    # every layer's output recorded, as the unpatched model records them
    r = ref(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
    p = pat(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
    assert p.hidden_states is not None and len(p.hidden_states) == len(r.hidden_states) == 3
    for a, b in zip(p.hidden_states, r.hidden_states):
        assert rel(a, b) <= 1e-5
    # checkpointed, both ways torch offers: the same loss and gradients. Reentrant: each
    # layer's forward without gradients, then again in the backward (4 dmove forwards for 2
    # layers); non-reentrant: torch recomputes only when the saved tensors it dropped are
    # needed, and dmove's layer saves none with autograd (its activations are in its own
    # arena), so each runs once
    for reentrant, forwards in ((True, 4), (False, 2)):
        r2, p2 = copy.deepcopy(ref), copy.deepcopy(pat)
        for m in (r2, p2):
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
            m.train()
        assert all(l.gradient_checkpointing for l in p2.bert.encoder.layer)
        dt.reset_copy_stats()
        same_step(r2, p2, input_ids=ids, attention_mask=mask, labels=labels)
        st = dt.copy_stats()
        assert st["forward"] == forwards and st["backward"] == 2, (reentrant, st)
    # a model pickled with its patched layers (whose class is transformers' BertLayer too)
    # loads and runs (one that recorded hidden states holds transformers' hooks: those do
    # not pickle, patched or not)
    fresh = dt.patch(BertForMaskedLM(tiny_config())).eval()
    buf = io.BytesIO()
    torch.save(fresh, buf)
    buf.seek(0)
    again = torch.load(buf, weights_only=False)
    assert type(again.bert.encoder.layer[0]) is type(fresh.bert.encoder.layer[0])
    assert type(fresh.bert.encoder.layer[0]).__name__ == "BertLayer"
    with torch.no_grad():
        want = fresh(input_ids=ids, attention_mask=mask).logits
        assert rel(again(input_ids=ids, attention_mask=mask).logits, want) <= 1e-6
    # and in a new process that has not patched anything
    path = tmp_path / "patched.pt"
    torch.save(fresh, path)
    torch.save((ids, mask, want), tmp_path / "io.pt")
    code = (f"import torch, dmove.torch\n"
            f"m = torch.load({str(path)!r}, weights_only=False)\n"
            f"ids, mask, want = torch.load({str(tmp_path / 'io.pt')!r})\n"
            f"with torch.no_grad():\n"
            f"    got = m(input_ids=ids, attention_mask=mask).logits\n"
            f"assert float((got - want).norm() / want.norm()) <= 1e-6\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_sequence_classification_and_no_mask():
    torch.manual_seed(1)
    ref = BertForSequenceClassification(tiny_config(num_labels=3))
    pat = dt.patch(copy.deepcopy(ref))
    ids, _, _ = batch(1)
    y = torch.tensor([0, 2, 1])
    same_step(ref, pat, input_ids=ids, labels=y)  # no attention_mask: None to the layers


def test_patch_keeps_parameters_and_state_dict():
    torch.manual_seed(2)
    m = BertModel(tiny_config())
    keys = list(m.state_dict().keys())
    params = {id(p) for p in m.parameters()}
    dt.patch(m)
    assert list(m.state_dict().keys()) == keys
    assert {id(p) for p in m.parameters()} == params
    assert all(isinstance(p, torch.nn.Parameter) for p in m.parameters())


def test_standalone_layer_and_parameter_updates():
    torch.manual_seed(3)
    layer = dt.BertLayer(tiny_config())
    names = [n for n, _ in layer.named_parameters()]
    assert "attention.self.query.weight" in names and "output.LayerNorm.bias" in names
    x = torch.randn(2, 7, 32)
    y1 = layer(x)
    with torch.no_grad():
        layer.output.LayerNorm.bias.add_(1.0)      # an in-place change is seen
    y2 = layer(x)
    assert not torch.allclose(y1, y2)
    # non-contiguous input: taken (gathered by the copy in)
    xt = torch.randn(7, 2, 32).transpose(0, 1)
    assert torch.allclose(layer(xt), layer(xt.contiguous()))


def test_dropout_train_eval_and_seed():
    torch.manual_seed(4)
    layer = dt.BertLayer(tiny_config(dropout=0.1))
    x = torch.randn(2, 8, 32)
    layer.eval()
    assert torch.equal(layer(x), layer(x))
    layer.train()
    torch.manual_seed(10)
    a = layer(x)
    b = layer(x)
    torch.manual_seed(10)
    c = layer(x)
    assert not torch.equal(a, b)
    assert torch.equal(a, c)
    layer.eval()
    e = layer(x)
    assert not torch.equal(a, e)
    # the patched model too: the same seed, the same loss and gradients
    ref = BertForMaskedLM(tiny_config(dropout=0.1))
    ids, mask, labels = batch()
    out = []
    for _ in range(2):
        m = dt.patch(copy.deepcopy(ref)).train()
        torch.manual_seed(7)
        loss = m(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        out.append((loss.detach(), m.bert.encoder.layer[0].intermediate.dense.weight.grad))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def test_layer_settings_follow_the_modules():
    """What runs is what the submodules hold now, as in torch: Dropout.p set to 0 after the
    patch (fine-tuning), LayerNorm.eps changed, a wrapped layer of other heads than the
    model's config; a second patch is a no-op."""
    torch.manual_seed(5)
    ref = BertForMaskedLM(tiny_config(dropout=0.1))
    pat = dt.patch(copy.deepcopy(ref))
    assert dt.patch(pat) is pat
    for m in (ref, pat):
        for mod in m.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
            if isinstance(mod, torch.nn.LayerNorm):
                mod.eps = 1e-3
    ref.train(), pat.train()
    ids, mask, labels = batch()
    same_step(ref, pat, input_ids=ids, attention_mask=mask, labels=labels)
    # a layer made with 4 heads and relu under a model config of 2 heads and gelu
    other = BertConfig(**{**tiny_config().to_dict(), "num_attention_heads": 4, "hidden_act": "relu"})
    hf = BertModel(other).eval()
    box = torch.nn.Module()
    box.config, box.inner = tiny_config(), copy.deepcopy(hf)
    dt.patch(box)
    assert "heads=4" in repr(box.inner.encoder.layer[0]) and "act=relu" in repr(box.inner.encoder.layer[0])
    x = torch.randn(2, 6, 32)
    want = hf.encoder.layer[0](x)
    want = want[0] if isinstance(want, tuple) else want
    assert rel(box.inner.encoder.layer[0](x), want) <= 1e-5


def test_dropout_modules_activations_and_decoders():
    """Dropout runs as each Dropout module runs (a layer in train() with its submodules in
    eval() drops nothing; MC dropout and an nn.Identity among active dropouts are refused,
    not run at the wrong rate); an activation clipped past 6 is not taken for relu or gelu;
    p = 1 in eval runs; an EncoderDecoderModel is refused for its decoder, nothing patched."""
    torch.manual_seed(6)
    cfg = tiny_config(dropout=0.1)
    cfg._attn_implementation = "eager"
    hf = BertModel(cfg).encoder.layer[0]
    pat = dt.BertLayer(cfg, layer=copy.deepcopy(hf))
    x = torch.randn(2, 8, 32)
    for m in (hf, pat):  # the layer trains, its submodules do not: no dropout, as transformers
        m.train()
        for d in m.modules():
            if d is not m:
                d.eval()
    want = hf(x)
    want = want[0] if isinstance(want, tuple) else want
    assert torch.equal(pat(x), pat(x)) and rel(pat(x), want) <= 1e-5
    pat.eval()
    for d in pat.modules():  # MC dropout: the hidden dropouts train, the attention does not
        if isinstance(d, torch.nn.Dropout):
            d.train()
    with pytest.raises(ValueError, match="mode"):
        pat(x)
    pat.train()  # every module trains again; two hidden dropouts replaced by nn.Identity
    pat.attention.output.dropout = torch.nn.Identity()
    pat.output.dropout = torch.nn.Identity()
    with pytest.raises(ValueError, match="dropouts differ"):
        pat(x)
    pat.attention.self.dropout = torch.nn.Identity()  # all three off: no dropout while training
    assert torch.equal(pat(x), pat(x))
    pat.output.dropout = torch.nn.AlphaDropout(0.1)
    with pytest.raises(ValueError, match="AlphaDropout"):
        pat(x)
    # activations told by their values far past the pre-activations of [-6, 6]
    from transformers.activations import ACT2FN
    for fn in (torch.nn.ReLU6(), ACT2FN["gelu_10"]):
        lay = dt.BertLayer(tiny_config()).eval()
        lay.intermediate.intermediate_act_fn = fn
        with pytest.raises(ValueError, match="activation"):
            lay(x)
    one = tiny_config(dropout=1.0)
    ev = dt.BertLayer(one).eval()  # transformers takes p = 1; in eval nothing is dropped
    assert torch.isfinite(ev(x)).all()
    with pytest.raises(ValueError, match="probability 1"):
        ev.train()(x)
    from transformers import BertLMHeadModel, EncoderDecoderModel
    dec_cfg = tiny_config(is_decoder=True, add_cross_attention=True)
    ed = EncoderDecoderModel(encoder=BertModel(tiny_config()), decoder=BertLMHeadModel(dec_cfg))
    with pytest.raises(ValueError, match="cross-attention"):
        dt.patch(ed)
    assert not any(isinstance(m, dt.BertLayer) for m in ed.modules())  # all or nothing


def test_two_forwards_before_backward():
    # gradient accumulation over two calls, as gradient checkpointing or a siamese model
    torch.manual_seed(5)
    ref = dt.BertLayer(tiny_config())
    x1 = torch.randn(2, 6, 32, requires_grad=True)
    x2 = torch.randn(2, 6, 32, requires_grad=True)
    (ref(x1).square().sum() + 2 * ref(x2).square().sum()).backward()
    g_two = {n: p.grad.clone() for n, p in ref.named_parameters()}
    ref.zero_grad()
    ref(x1).square().sum().backward()
    (2 * ref(x2).square().sum()).backward()
    for n, p in ref.named_parameters():
        assert rel(p.grad, g_two[n]) <= 1e-6, n
    # the layers made for four forwards that waited together are kept while each step
    # accumulates four (not made again), let go after a step of one: one a shape is kept;
    # seven shapes pending at once, then four kept
    x = torch.randn(2, 6, 32)
    sum(ref(x).sum() for _ in range(4)).backward()
    made = {id(c) for cs in ref._cores.values() for c in cs}
    sum(ref(x).sum() for _ in range(4)).backward()
    assert {id(c) for cs in ref._cores.values() for c in cs} == made and len(made) == 4
    ref(x).sum().backward()
    ref(x).sum().backward()
    assert sum(map(len, ref._cores.values())) == 1
    sum(ref(torch.randn(2, 3 + k, 32)).sum() for k in range(7)).backward()
    ref(torch.randn(2, 20, 32)).sum().backward()
    assert len(ref._cores) == 4 and all(len(cs) == 1 for cs in ref._cores.values())


def test_weights_tied_inside_the_layer():
    # the key's weight the query's: each use's gradient summed into the one Parameter
    torch.manual_seed(8)
    cfg = tiny_config()
    cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = 0.0
    hf = BertModel(cfg).eval()
    sa = hf.encoder.layer[0].attention.self
    sa.key.weight = sa.query.weight
    ours = dt.patch(copy.deepcopy(hf))
    x = torch.randn(2, 5, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    w = torch.randn(2, 5, 32)  # not a LayerNorm output's square: that sums to a constant
    (hf(inputs_embeds=x).last_hidden_state * w).sum().backward()
    (ours(inputs_embeds=x2).last_hidden_state * w).sum().backward()
    assert rel(x2.grad, x.grad) <= 1e-5
    for (n, p), (_, q) in zip(hf.named_parameters(), ours.named_parameters()):
        assert (p.grad is None) == (q.grad is None), n  # the pooler, the word table: unused
        if p.grad is not None and not n.endswith("key.bias"):  # that one's is 0 but rounding
            assert rel(q.grad, p.grad) <= 1e-5, n


def test_refusals(monkeypatch):
    monkeypatch.delenv("DMOVE_CUDA_EMULATE", raising=False)
    layer = dt.BertLayer(tiny_config())
    x = torch.randn(2, 5, 32)
    with pytest.raises(TypeError, match="float32"):
        layer(x.double())
    with pytest.raises(ValueError, match="expected"):
        layer(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match="output_attentions"):
        layer(x, output_attentions=True)
    with pytest.raises(ValueError, match="head_mask"):
        layer(x, head_mask=torch.ones(2))
    causal = torch.triu(torch.full((5, 5), -1e9), 1).expand(2, 1, 5, 5)
    with pytest.raises(ValueError, match="differs between queries"):
        layer(x, causal)
    two = BertConfig(hidden_size=32, num_attention_heads=2, intermediate_size=64,
                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2)
    with pytest.raises(ValueError, match="dropouts differ"):  # training: the three must agree
        dt.BertLayer(two)
    with pytest.raises(ValueError, match="dropouts differ"):
        dt.BertLayer(two).eval().train()(x)
    ev = BertModel(BertConfig(**{**two.to_dict(), "num_hidden_layers": 1})).eval()
    dt.patch(ev)(inputs_embeds=torch.randn(2, 5, 32))  # evaluation: no dropout, nothing to agree
    eager = tiny_config()
    eager._attn_implementation = "eager"  # (sdpa refuses output_attentions itself)
    oa = BertModel(eager)
    dt.patch(oa).config.output_attentions = True  # set on the config, not passed in the call
    with pytest.raises(ValueError, match="output_attentions"):
        oa(input_ids=torch.ones(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="hidden_act"):
        dt.BertLayer(tiny_config(hidden_act="silu"))
    with pytest.raises(ValueError, match="no transformers BertLayer"):
        dt.patch(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="dmove_device"):
        dt.BertLayer(tiny_config(), dmove_device="tpu")
    with pytest.raises(ValueError, match="host emulation"):
        dt.BertLayer(tiny_config(), dmove_device="cuda")(x)
    if torch.cuda.is_available():  # a GPU's hidden states with the CPU's parameters
        with pytest.raises(TypeError, match="with hidden_states on cuda"):
            layer(x.cuda())


@pytest.mark.parametrize("act", ["gelu_python", "gelu_fast", "gelu_accurate"])
def test_other_names_of_the_same_activations(act):
    """transformers' other names for erf GELU and tanh GELU (the same values, checked by
    _act_of when the layer runs): patched equals unpatched."""
    torch.manual_seed(4)
    try:
        ref = BertForMaskedLM(tiny_config(hidden_act=act)).train()
    except KeyError:
        pytest.skip(f"this transformers has no {act}")
    pat = dt.patch(copy.deepcopy(ref))
    ids, mask, labels = batch()
    same_step(ref, pat, input_ids=ids, attention_mask=mask, labels=labels)


def test_submodules_dmove_would_skip_are_refused():
    """What dmove's fused layer would silently skip, on every call (also once the layer has
    run): a Linear subclass with a forward of its own, an adapter wrapping a Linear, forward
    hooks on a submodule, a changed attention scaling."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32)

    class Scaled(torch.nn.Linear):
        def forward(self, inp):
            return super().forward(inp) * 2

    class Adapter(torch.nn.Module):  # peft-style: weight and bias are the wrapped Linear's
        def __init__(self, base):
            super().__init__()
            self.base, self.a = base, torch.nn.Linear(base.in_features, base.out_features, bias=False)

        weight = property(lambda self: self.base.weight)
        bias = property(lambda self: self.base.bias)
        in_features = property(lambda self: self.base.in_features)
        out_features = property(lambda self: self.base.out_features)

        def forward(self, inp):
            return self.base(inp) + self.a(inp)

    layer = dt.BertLayer(tiny_config())
    layer(x)  # it ran once: its parameter names are known
    d = layer.intermediate.dense
    layer.intermediate.dense = Scaled(d.in_features, d.out_features)
    with pytest.raises(TypeError, match="intermediate.dense is a Scaled"):
        layer(x)
    layer.intermediate.dense = d
    q = layer.attention.self.query
    layer.attention.self.query = Adapter(q)
    with pytest.raises(TypeError, match="attention.self.query is a Adapter"):
        layer(x)
    layer.attention.self.query = q
    h = layer.output.LayerNorm.register_forward_hook(lambda m, i, o: o * 0)
    with pytest.raises(ValueError, match="forward hooks"):
        layer(x)
    h.remove()
    y = layer(x)  # all back: it runs
    ref = BertModel(tiny_config()).encoder.layer[0]
    ref.load_state_dict({k: v for k, v in layer.state_dict().items()})
    want = ref(x)
    want = want[0] if isinstance(want, tuple) else want
    assert rel(y, want) <= 1e-5
    if hasattr(layer.attention.self, "scaling"):
        layer.attention.self.scaling = 1.0
        with pytest.raises(ValueError, match="scaling"):
            layer(x)
    # a plain module holding a model: its layers' own configs, where transformers keeps them
    holder = torch.nn.Module()
    holder.bert = BertModel(tiny_config())
    if hasattr(holder.bert.encoder.layer[0].attention.self, "config"):
        dt.patch(holder)
        assert isinstance(holder.bert.encoder.layer[1], dt.BertLayer)
    else:
        with pytest.raises(ValueError, match="patch.module.bert."):
            dt.patch(holder)


def cuda_pair(monkeypatch, cfg, unpad=False):
    """A CPU layer and one on dmove's CUDA backend with its parameters, the latter on CPU
    tensors through the CUDA build's host emulation (DMOVE_CUDA_EMULATE=1): the GPU path's
    device buffers (DLPack views), storage types and copies, without a GPU."""
    monkeypatch.setenv("DMOVE_CUDA_EMULATE", "1")
    cpu = dt.BertLayer(cfg, unpad=unpad)
    gpu = dt.BertLayer(cfg, unpad=unpad, dmove_device="cuda")
    gpu.load_state_dict(cpu.state_dict())
    try:
        gpu(torch.zeros(1, 2, cfg.hidden_size))
    except dt.Error as e:
        if "without CUDA" in str(e):
            pytest.skip(f"libdmove.so has no CUDA backend: {e}")
        raise
    return cpu, gpu


def layer_step(m, x, mask, dtype=torch.float32):
    """Output, input gradient and parameter gradients of one step (seeded dropout)."""
    xx = x.detach().to(dtype).clone().requires_grad_()
    torch.manual_seed(5)
    y = m(xx, mask)
    w = torch.cos(torch.arange(y.numel(), dtype=torch.float32, device=y.device)).view_as(y)
    (y.float() * w).sum().backward()
    grads = {k: p.grad.float().cpu() for k, p in m.named_parameters()}
    m.zero_grad()
    return y.detach().float().cpu(), xx.grad.float().cpu(), grads


@pytest.mark.parametrize("unpad", [False, True])
def test_cuda_backend_equals_cpu(monkeypatch, unpad):
    cpu, gpu = cuda_pair(monkeypatch, tiny_config(dropout=0.1), unpad)
    x = torch.randn(3, 12, 32)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 2:] = 0
    for mode in ("train", "eval"):  # dropout (the same Philox masks), then none
        getattr(cpu, mode)()
        getattr(gpu, mode)()
        (y0, dx0, g0), (y1, dx1, g1) = layer_step(cpu, x, mask), layer_step(gpu, x, mask)
        assert rel(y1, y0) <= 1e-5 and rel(dx1, dx0) <= 1e-5, mode
        for k in g0:
            if not k.endswith("key.bias"):  # rounding noise (test_masked_lm_equals_unpatched)
                assert rel(g1[k], g0[k]) <= 1e-5, (mode, k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here (the emulation's tests above)")
def test_gpu_tensors(monkeypatch):
    monkeypatch.delenv("DMOVE_CUDA_EMULATE", raising=False)
    cfg = tiny_config(dropout=0.1)
    cpu = dt.BertLayer(cfg)
    gpu = dt.BertLayer(cfg).cuda()
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(3, 12, 32)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[2, 4:] = 0
    y0, dx0, g0 = layer_step(cpu, x, mask)
    try:
        y1, dx1, g1 = layer_step(gpu, x.cuda(), mask.cuda())
    except dt.Error as e:
        if "without CUDA" in str(e):
            pytest.skip(f"libdmove.so has no CUDA backend: {e}")
        raise
    assert rel(y1, y0) <= 1e-5 and rel(dx1, dx0) <= 1e-5
    assert max(rel(g1[k], g0[k]) for k in g0 if not k.endswith("key.bias")) <= 1e-5
    y2, dx2, g2 = layer_step(gpu, x.cuda(), mask.cuda(), torch.bfloat16)  # bf16 storage
    assert rel(y2, y0) <= 2e-2 and rel(dx2, dx0) <= 5e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here (the emulation's tests above)")
@pytest.mark.parametrize("attn_op", ["0", "1"])
def test_masked_lm_gpu_bf16_as_close_as_unpatched(monkeypatch, attn_op):
    """BertForMaskedLM on a GPU under bf16 autocast (heads of 64, padding, dropout off), the
    padded attention as its ops and (DMOVE_CUDA_ATTN_OP=1) as one op on the flash kernels:
    patched, its loss and every gradient within the bf16 tolerance of the unpatched model in
    fp32: twice the unpatched model's own error under the same autocast + 2e-2, tensor by
    tensor (dmove keeps the residual stream in bf16 too, where autocast keeps fp32)."""
    monkeypatch.delenv("DMOVE_CUDA_EMULATE", raising=False)
    monkeypatch.setenv("DMOVE_CUDA_ATTN_OP", attn_op)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=128, num_attention_heads=2, intermediate_size=256,
                     num_hidden_layers=2, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    ref = BertForMaskedLM(cfg).cuda().train()
    pat = dt.patch(copy.deepcopy(ref)).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (4, 40), generator=g)
    mask = torch.ones(4, 40, dtype=torch.long)
    mask[1, 29:] = 0
    mask[3, 7:] = 0
    labels = torch.where(torch.rand(4, 40, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    labels = labels.masked_fill(mask == 0, -100)
    labels[0, 0] = ids[0, 0]
    inputs = dict(input_ids=ids.cuda(), attention_mask=mask.cuda(), labels=labels.cuda())

    def step(m, bf16):
        m.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = m(**inputs).loss
        loss.backward()
        return loss.detach().float(), {k: p.grad.detach().float().clone() for k, p in m.named_parameters()
                                       if p.grad is not None}

    try:
        l32, g32 = step(ref, False)
        l16, g16 = step(ref, True)
        lp, gp = step(pat, True)
    except dt.Error as e:
        if "without CUDA" in str(e):
            pytest.skip(f"libdmove.so has no CUDA backend: {e}")
        raise
    assert rel(lp, l32) <= 2 * rel(l16, l32) + 1e-2, (float(lp), float(l16), float(l32))
    assert gp.keys() == g32.keys()
    far = [k for k in g32 if not k.endswith("key.bias") and not rel(gp[k], g32[k]) <= 2 * rel(g16[k], g32[k]) + 2e-2]
    assert not far, [(k, rel(gp[k], g32[k]), rel(g16[k], g32[k])) for k in far]


def test_cuda_backend_bf16_storage(monkeypatch):
    cpu, gpu = cuda_pair(monkeypatch, tiny_config())
    x = torch.randn(2, 9, 32)
    y0, dx0, g0 = layer_step(cpu, x, None)
    y1, dx1, g1 = layer_step(gpu, x, None, torch.bfloat16)  # bfloat16 hidden states: bf16 storage
    assert rel(y1, y0) <= 2e-2 and rel(dx1, dx0) <= 5e-2
    assert all(g1[k].dtype == torch.float32 for k in g1)  # the parameters' own type
    assert max(rel(g1[k], g0[k]) for k in g0 if not k.endswith("key.bias")) <= 5e-2


def test_cuda_backend_flash_attention(monkeypatch):
    """bf16 storage, heads of 64: the padded layer's attention as one op on the flash kernels
    (DMOVE_CUDA_ATTN_OP=1 when its dmove layers are made; lane by lane in the emulation),
    its mask inside; as close to the fp32 CPU layer as the same layer with the attention as
    its ops (DMOVE_CUDA_ATTN_OP=0)."""
    cfg = BertConfig(vocab_size=100, hidden_size=128, num_attention_heads=2, intermediate_size=64,
                     num_hidden_layers=1, max_position_embeddings=32, hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1)
    monkeypatch.setenv("DMOVE_CUDA_ATTN_OP", "1")
    cpu, gpu = cuda_pair(monkeypatch, cfg)
    x = torch.randn(2, 20, 128)
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 13:] = 0
    mask[0, 3] = 0  # a hole: not 1s then 0s
    y0, dx0, g0 = layer_step(cpu, x, mask)
    y1, dx1, g1 = layer_step(gpu, x, mask, torch.bfloat16)  # its dmove layer for (2, 20) made now
    monkeypatch.setenv("DMOVE_CUDA_ATTN_OP", "0")
    ops = dt.BertLayer(cfg, dmove_device="cuda")
    ops.load_state_dict(cpu.state_dict())
    y2, dx2, g2 = layer_step(ops, x, mask, torch.bfloat16)
    assert not torch.equal(dx1, dx2)  # two ways: the flash op and the ops (rounded apart)
    assert rel(y1, y0) <= 2e-2 and rel(dx1, dx0) <= 5e-2
    assert rel(y1, y0) <= 1.5 * rel(y2, y0) + 5e-3 and rel(dx1, dx0) <= 1.5 * rel(dx2, dx0) + 5e-3
    for k in g0:
        if not k.endswith("key.bias"):
            assert rel(g1[k], g0[k]) <= 1.5 * rel(g2[k], g0[k]) + 5e-3, k


def test_trainer_loss_falls(tmp_path):
    from transformers import Trainer, TrainingArguments
    torch.manual_seed(6)
    model = dt.patch(BertForMaskedLM(tiny_config()))
    ids, mask, labels = batch()
    data = [{"input_ids": ids[k], "attention_mask": mask[k], "labels": labels[k]}
            for k in range(B)] * 8
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=B,
                             max_steps=12, learning_rate=1e-3, logging_steps=1,
                             report_to=[], save_strategy="no", use_cpu=True,
                             dataloader_num_workers=0, max_grad_norm=1.0)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) >= 10
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    assert any(isinstance(m, dt.BertLayer) for m in trainer.model.modules())


@pytest.mark.parametrize("fused", [False, True])
def test_optimizer_steps_equal_unpatched(fused):
    # fused optimizers (the Trainer's default adamw_torch_fused) update the parameters in
    # place without a version bump: dmove must still see every step's weights
    torch.manual_seed(3)
    ref = BertForMaskedLM(tiny_config()).train()
    pat = dt.patch(copy.deepcopy(ref))
    o_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, fused=fused)
    o_pat = torch.optim.AdamW(pat.parameters(), lr=1e-2, fused=fused)
    for step in range(4):
        ids, mask, labels = batch(step)
        losses = []
        for m, o in ((ref, o_ref), (pat, o_pat)):
            loss = m(input_ids=ids, attention_mask=mask, labels=labels).loss
            o.zero_grad()
            loss.backward()
            o.step()
            losses.append(float(loss.detach()))
        # each step's loss is made with the weights of the steps before: stale weights in
        # dmove (the fused optimizer's updates missed) differed by 8e-3 here
        assert abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[0]), (step, losses)
    # the weights after 4 steps: AdamW's first steps move each element by about lr * the
    # sign of its gradient, so an element whose gradient is rounding noise moves by 2 lr
    # between the two (measured 1.9e-4 at most, the key bias aside; stale weights: 6.8e-2)
    for (k, p1), (_, p2) in zip(ref.named_parameters(), pat.named_parameters()):
        if not k.endswith("attention.self.key.bias"):  # its gradient is all rounding noise
            assert rel(p2, p1) < 1e-3, (k, rel(p2, p1))


def test_inference_mode_first_then_training_threads_and_copies():
    torch.manual_seed(4)
    layer = dt.BertLayer(tiny_config())
    x = torch.randn(B, J, 32)
    with torch.inference_mode():
        y0 = layer(x)
    # the buffers made under inference_mode take a training call afterwards
    xg = x.clone().requires_grad_()
    y = layer(xg)
    y.sum().backward()
    assert torch.allclose(y.detach(), y0, atol=1e-6) and xg.grad is not None
    # threads calling one layer at once get each its own answer
    import threading
    xs = [torch.randn(B, J, 32) for _ in range(4)]
    with torch.no_grad():
        want = [layer(v) for v in xs]
    bad = []

    def run(k):
        with torch.no_grad():
            for _ in range(20):
                if not torch.allclose(layer(xs[k]), want[k], atol=1e-6):
                    bad.append(k)
    ts = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad
    # deepcopy (and pickling) of a layer that ran: the copy makes its own dmove layer
    twin = copy.deepcopy(layer)
    with torch.no_grad():
        assert torch.allclose(twin(xs[0]), want[0], atol=1e-6)
    # a second-order backward through the layer is refused, not silently wrong
    xg = x.clone().requires_grad_()
    g, = torch.autograd.grad(layer(xg).sum(), xg, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


def ddp_batch():
    """Four sequences whose halves hold as many labelled tokens each: the mean of the two
    ranks' mean losses is then the whole batch's mean, as one process computes it."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 100, (4, J), generator=g)
    mask = torch.ones(4, J, dtype=torch.long)
    mask[1, 11:] = 0
    mask[3, 11:] = 0
    pos = (torch.arange(J) % 4 == 1).expand(4, J) & mask.bool()
    labels = torch.where(pos, ids, torch.full_like(ids, -100))
    return ids, mask, labels


def _ddp_rank(rank, world, init, out):
    import datetime
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        torch.manual_seed(0)
        model = dt.patch(BertForMaskedLM(tiny_config()))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ids, mask, labels = ddp_batch()
        part = slice(rank * 2, rank * 2 + 2)
        ddp(input_ids=ids[part], attention_mask=mask[part], labels=labels[part]).loss.backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        torch.save(grads, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_distributed_data_parallel(tmp_path):
    # two processes (gloo), each its half of the batch through a patched model under DDP:
    # the gradients DDP averages are one unpatched process's on the whole batch
    world = 2
    out = str(tmp_path / "grads")
    torch.multiprocessing.spawn(_ddp_rank, args=(world, f"file://{tmp_path}/rendezvous", out),
                                nprocs=world, join=True)
    torch.manual_seed(0)
    ref = BertForMaskedLM(tiny_config())
    ids, mask, labels = ddp_batch()
    ref(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    got = [torch.load(f"{out}.{r}") for r in range(world)]
    n = 0
    for k, p in ref.named_parameters():
        if p.grad is None:
            continue
        assert torch.equal(got[0][k], got[1][k]), k  # DDP gave both ranks the same average
        if k.endswith("attention.self.key.bias"):  # rounding noise on both sides
            assert float(got[0][k].abs().max()) < 1e-8
            continue
        assert rel(got[0][k], p.grad) <= 1e-5, (k, rel(got[0][k], p.grad))
        n += 1
    assert n > 20
