"""dmove's whole-model commands from Python (dmove.embed, prepare, pretrain, finetune,
export, run): the embeddings against transformers' own model with sentence-transformers'
pooling, a pretrain and a finetune run end to end with their summaries, the export loaded
strictly by transformers, and failures raised as dmove.Error with the command's message."""
import json
import os

import pytest
import torch
from tokenizers import Tokenizer
from transformers import (AutoTokenizer, BertConfig, BertForSequenceClassification, BertModel, BertTokenizer,
                          BertTokenizerFast)

import dmove

WORDS = ["good", "great", "bad", "awful", "the", "a", "cat", "dog", "sat", "on", "mat", "."]


def make_model(path, layers=2, hidden=32, heads=4, positions=40):
    """A random BertModel saved as transformers saves it, with its vocab.txt."""
    torch.manual_seed(7)
    cfg = BertConfig(vocab_size=5 + len(WORDS), hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=2 * hidden,
                     max_position_embeddings=positions, hidden_act="gelu")
    model = BertModel(cfg).eval()
    model.save_pretrained(path, safe_serialization=True)
    with open(os.path.join(path, "vocab.txt"), "w") as f:
        f.write("".join(w + "\n" for w in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True}, f)
    return model


def tokenizer_of(path):
    return BertTokenizer(os.path.join(path, "vocab.txt"), do_lower_case=True)


def reference(model, tok, sentences, pooling, max_length):
    rows = []
    with torch.no_grad():
        for s in sentences:
            ids = tok(s, truncation=True, max_length=max_length, return_tensors="pt")["input_ids"]
            h = model(input_ids=ids).last_hidden_state[0]
            rows.append(h.mean(0) if pooling == "mean" else h[0])
    return torch.stack(rows)


def test_embed_equals_transformers(tmp_path):
    model = make_model(str(tmp_path))
    tok = tokenizer_of(str(tmp_path))
    sentences = ["The cat sat on the mat.", "good", "", "a dog " * 30, "Awful dog, great cat."]
    for pooling in ("mean", "cls"):
        got = dmove.embed(sentences, model=str(tmp_path), pooling=pooling, threads=2)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
        assert got.shape == (len(sentences), 32)
        ref = reference(model, tok, sentences, pooling, 40)
        assert torch.allclose(got, ref, rtol=1e-5, atol=2e-5), (got - ref).abs().max()
    # normalized, cut shorter: each row of unit length, the long line cut to 12 tokens
    got = dmove.embed(sentences, model=str(tmp_path), normalize=True, max_length=12)
    ref = torch.nn.functional.normalize(reference(model, tok, sentences, "mean", 12), dim=1)
    assert torch.allclose(got, ref, rtol=1e-5, atol=2e-5)
    # no sentences: no rows
    assert dmove.embed([], model=str(tmp_path)).shape == (0, 32)
    # one string is one sentence
    one = dmove.embed("good", model=str(tmp_path))
    assert one.shape == (1, 32)
    assert torch.allclose(one[0], reference(model, tok, ["good"], "mean", 40)[0], rtol=1e-5, atol=2e-5)


def test_embed_refusals(tmp_path):
    make_model(str(tmp_path))
    with pytest.raises(ValueError, match="line break"):
        dmove.embed(["two\nlines"], model=str(tmp_path))
    with pytest.raises(TypeError, match="not a str"):
        dmove.embed([b"bytes"], model=str(tmp_path))
    with pytest.raises(TypeError, match="returns the embeddings"):
        dmove.embed(["x"], model=str(tmp_path), out="x.npy")
    with pytest.raises(UnicodeEncodeError):  # raised here, before the command starts (it once hung)
        dmove.embed(["a lone surrogate \ud800"], model=str(tmp_path))
    with pytest.raises(dmove.Error, match="max-length 400"):
        dmove.embed(["good"], model=str(tmp_path), max_length=400)
    os.remove(tmp_path / "config.json")
    with pytest.raises(dmove.Error, match="config.json"):
        dmove.embed(["good"], model=str(tmp_path))


def write_task(path, n, seed):
    g = torch.Generator().manual_seed(seed)
    with open(path, "w") as f:
        f.write("sentence\tlabel\n")
        for _ in range(n):
            c = int(torch.randint(0, 2, (), generator=g))
            word = ["good", "great"] if c == 0 else ["bad", "awful"]
            fill = ["the", "a", "cat", "dog", "sat", "on", "mat"]
            s = [word[int(torch.randint(0, 2, (), generator=g))] if k % 2 == 0
                 else fill[int(torch.randint(0, 7, (), generator=g))] for k in range(4)]
            f.write(" ".join(s) + "\t" + ("pos" if c == 0 else "neg") + "\n")


def test_finetune_and_export(tmp_path):
    make_model(str(tmp_path / "base"))
    tok = tokenizer_of(str(tmp_path / "base"))
    write_task(tmp_path / "train.tsv", 64, 1)
    write_task(tmp_path / "eval.tsv", 32, 2)
    r = dmove.finetune(train=tmp_path / "train.tsv", eval=tmp_path / "eval.tsv", init=tmp_path / "base",
                       labels=["neg", "pos"], epochs=3, batch=8, seq=12, lr=2e-3, lr_schedule="linear",
                       threads=2, seed=5, save=tmp_path / "ft.ckpt", quiet=True)
    assert r["classes"] == 2 and r["train_examples"] == 64 and r["eval_examples"] == 32
    assert r["steps"] == 24 and r["loss_last"] < r["loss_first"]
    # the tokenizer beside it (the base directory's vocab.txt, lowercased as its
    # tokenizer_config.json says): AutoTokenizer loads it and gives the run's ids
    dmove.export(tmp_path / "ft.ckpt", tmp_path / "out", tokenizer=tmp_path / "base")
    model = BertForSequenceClassification.from_pretrained(str(tmp_path / "out"))
    assert model.config.id2label == {0: "neg", 1: "pos"}
    saved = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    # the exported model's held-out accuracy is the run's
    right = 0
    with open(tmp_path / "eval.tsv") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    for text in [t for t, _ in rows] + ["The CAT sat, on Émile's mat!", "dog\tcat  [MASK] zebra"]:
        assert saved(text)["input_ids"] == tok(text)["input_ids"]
    # a tokenizer BertTokenizer cannot be (words cut at 4 characters, "mat" special): its
    # tokenizer.json as it is, as PreTrainedTokenizerFast, the same ids as tokenizers gives
    fast = BertTokenizerFast(str(tmp_path / "base" / "vocab.txt"), do_lower_case=True)
    fast.add_special_tokens({"additional_special_tokens": ["mat"]})
    spec = json.loads(fast.backend_tokenizer.to_str())
    spec["model"]["max_input_chars_per_word"] = 4
    with open(tmp_path / "short.json", "w") as f:
        json.dump(spec, f)
    dmove.export(tmp_path / "ft.ckpt", tmp_path / "out2", tokenizer=tmp_path / "short.json")
    assert not (tmp_path / "out2" / "vocab.txt").exists()
    short = AutoTokenizer.from_pretrained(str(tmp_path / "out2"))
    own = Tokenizer.from_file(str(tmp_path / "short.json"))
    for text in ["The cat sat on the mat.", "great greatgreat MAT thematdog", "awful [MASK] zebra"]:
        assert short(text)["input_ids"] == own.encode(text).ids
    # a BertTokenizer's vocab.txt beside that tokenizer.json would be read for nothing:
    # refused before anything is written
    with pytest.raises(dmove.Error, match="tokenizer.json.*instead of"):
        dmove.export(tmp_path / "ft.ckpt", tmp_path / "out2", tokenizer=tmp_path / "base")
    assert not (tmp_path / "out2" / "vocab.txt").exists()
    model.eval()
    with torch.no_grad():
        for text, label in rows:
            ids = tok(text, truncation=True, max_length=12, return_tensors="pt")["input_ids"]
            logits = model(input_ids=ids).logits[0]
            right += model.config.id2label[int(logits.argmax())] == label
    assert abs(right / len(rows) - r["eval_accuracy"]) < 1e-6


def test_prepare_and_pretrain(tmp_path):
    make_model(str(tmp_path / "base"))
    corpus = tmp_path / "corpus.txt"
    g = torch.Generator().manual_seed(3)
    with open(corpus, "w") as f:
        for doc in range(20):
            for _ in range(4):
                f.write(" ".join(WORDS[int(k)] for k in torch.randint(0, len(WORDS), (9,), generator=g)) + "\n")
            f.write("\n")
    out = dmove.prepare(corpus, tokenizer=tmp_path / "base" / "vocab.txt", lowercase=True,
                        out=tmp_path / "shards", valid_fraction=0.2, quiet=True)
    assert isinstance(out, str)
    r = dmove.pretrain(data=tmp_path / "shards", init=tmp_path / "base", steps=4, batch=4, seq=16,
                       threads=2, seed=1, export=tmp_path / "mlm", quiet=True)
    assert r["steps"] == 4 and r["masked_scored"] > 0
    assert all(k in r for k in ("loss_first", "loss_last"))
    assert os.path.exists(tmp_path / "mlm" / "model.safetensors")


def test_run_errors_and_options(tmp_path, monkeypatch):
    # a usage error: the command's own message, what to do included
    with pytest.raises(dmove.Error, match="unknown option '--no-such-option'"):
        dmove.run("pretrain", no_such_option=3)
    # text out, flags, standard input
    assert "usage: dmove finetune" in dmove.run("finetune", help=True)
    with open(tmp_path / "v.txt", "w") as f:
        f.write("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx\n")
    assert dmove.run("tokenize", "-", tokenizer=tmp_path / "v.txt", lowercase=True, input="x y\nX\n",
                     quiet=True) == "2 5 1 3\n2 5 3\n"
    monkeypatch.setenv("DMOVE_BIN", str(tmp_path / "none"))
    with pytest.raises(dmove.Error, match="DMOVE_BIN"):
        dmove.program()
    monkeypatch.setenv("DMOVE_BIN", str(tmp_path))  # a directory
    with pytest.raises(dmove.Error, match="DMOVE_BIN"):
        dmove.program()
    monkeypatch.delenv("DMOVE_BIN")
    with pytest.raises(ValueError, match="holds a comma"):
        dmove.finetune(train="t.tsv", labels=["pos,neg", "x"])

