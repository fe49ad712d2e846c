"""dmove's whole-model commands from Python: pretrain, finetune, embed, prepare, export.

Each runs the `dmove` program (the one the package carries, built with its library) as a
child process and returns what it measured, so a training loop written in Python can call
dmove's whole-model trainer the way it calls any other step:

    import dmove
    dmove.prepare("corpus.txt", tokenizer="vocab.txt", lowercase=True, out="shards/")
    r = dmove.pretrain(data="shards/", tokenizer="vocab.txt", lowercase=True, layers=4,
                       steps=200, save="run.ckpt", export="model/")
    print(r["loss_last"], r["eval_loss"])       # the command's --json summary, a dict
    emb = dmove.embed(["A man is eating food."], model="model/")   # (1, hidden) tensor
    dmove.finetune(train="train.tsv", eval="dev.tsv", init="model/", epochs=2)

Keyword arguments are the command's options (`dmove <command> --help`): `lr_schedule=
"linear"` is `--lr-schedule linear`, `True` a bare flag (`no_unpad=True`), `False` or
`None` leaves the option out, a list or tuple is joined by commas (`labels=["neg",
"pos"]`). Progress goes to standard error as the command writes it (`quiet=True`, a
keyword of these functions, not an option, keeps it back).
A command that fails raises `dmove.Error` with its message (what to do included); an
interrupt (Ctrl-C) reaches the command, which saves what it promised to save, and
re-raises here."""
import ast
import json as json_mod
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading

from ._lib import Error

__all__ = ["program", "run", "pretrain", "finetune", "prepare", "export", "embed"]


def program():
    """The `dmove` program the commands run: $DMOVE_BIN if set, else the one installed with
    this package (`make python` copies it beside libdmove.so), else `dmove` on the PATH."""
    env = os.environ.get("DMOVE_BIN")
    if env:
        if not os.path.isfile(env) or not os.access(env, os.X_OK):
            raise Error(f"DMOVE_BIN={env}: no executable dmove program there")
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "dmove")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("dmove")
    if found:
        return found
    raise Error("no dmove program: build it with `make python` in dmove's source tree and "
                "reinstall the package (pip install ./python), or set DMOVE_BIN to a dmove "
                "program")


def _argv(command, args, options):
    argv = [program(), command]
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            items = [str(v) for v in value]
            for v in items:
                if "," in v:
                    raise ValueError(f"{key}: the item {v!r} holds a comma, which separates the items of {flag}")
            argv += [flag, ",".join(items)]
        else:
            argv += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    for a in args:
        argv.append(os.fspath(a) if isinstance(a, os.PathLike) else str(a))
    return argv


def _pump(stream, sink):
    sink.append(stream.read())


def run(command, *args, quiet=False, json=False, input=None, **options):
    """Runs `dmove COMMAND [options] [args]`; returns its standard output (text), or with
    json=True the JSON object it prints (its --json summary) as a dict. input: text (or
    bytes) for its standard input. The command never outlives the call: an exception here
    (a signal's, a KeyboardInterrupt) stops it the way Ctrl-C does and waits for it."""
    if json:
        options["json"] = True
    argv = _argv(command, args, options)
    data = input.encode("utf-8") if isinstance(input, str) else input  # before the child starts
    # its own session: a Ctrl-C reaches this process alone, which passes one SIGINT on (a
    # second one would end the command at once, without its last save)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out, tail = [], []
    threads = [threading.Thread(target=_pump, args=(proc.stdout, out), daemon=True)]
    if data is not None:
        def feed():
            try:
                proc.stdin.write(data)
            except OSError:  # the command stopped reading: its error says why
                pass
            finally:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        threads.append(threading.Thread(target=feed, daemon=True))
    for t in threads:
        t.start()
    interrupted = False
    try:
        while True:
            try:
                for raw in iter(proc.stderr.readline, b""):
                    line = raw.decode("utf-8", "replace")
                    tail.append(line)
                    del tail[:-40]
                    if not quiet:
                        sys.stderr.write(line)
                        sys.stderr.flush()
                rc = proc.wait()
                break
            except KeyboardInterrupt:
                interrupted = True  # the command stops and saves; wait for it (again: at once)
                try:
                    proc.send_signal(signal.SIGINT)
                except ProcessLookupError:
                    pass
    finally:
        if proc.poll() is None:  # leaving on another exception: stop it as Ctrl-C does
            try:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            except ProcessLookupError:
                pass
    for t in threads:
        t.join()
    if interrupted:
        raise KeyboardInterrupt(f"dmove {command} interrupted (exit status {rc})")
    text = (out[0] if out else b"").decode("utf-8", "replace")
    if rc != 0:
        msg = "".join(tail).strip() or f"exit status {rc}"
        if rc < 0:
            msg = f"dmove {command} was killed by signal {-rc}" + (f": {msg}" if tail else "")
        raise Error(msg)
    if not json:
        return text
    try:
        return json_mod.loads(text)
    except ValueError as e:
        raise Error(f"dmove {command} --json printed no JSON object ({e}): {text[:200]!r}") from None


def pretrain(quiet=False, **options):
    """`dmove pretrain`: masked-LM pretraining of a whole BERT on prepared shards (data=
    the shards' folder or files). Returns its --json summary as a dict."""
    return run("pretrain", quiet=quiet, json=True, **options)


def finetune(quiet=False, **options):
    """`dmove finetune`: sequence classification from a TSV or JSONL (train=, eval=).
    Returns its --json summary as a dict."""
    return run("finetune", quiet=quiet, json=True, **options)


def prepare(*files, quiet=False, **options):
    """`dmove prepare FILES...`: text files into token shards (tokenizer=, out=)."""
    return run("prepare", *files, quiet=quiet, **options)


def export(checkpoint, out, tokenizer=None, lowercase=False, cased=False, quiet=False):
    """`dmove export`: a pretrain or finetune checkpoint's model as transformers saves it
    (out/model.safetensors and out/config.json); with `tokenizer` (the run's tokenizer.json,
    vocab.txt with lowercase or cased, or model directory) also out/vocab.txt and
    out/tokenizer_config.json as BertTokenizer saves them (or, for a tokenizer.json
    BertTokenizer cannot be, that file as it is with a PreTrainedTokenizerFast
    tokenizer_config.json), which AutoTokenizer.from_pretrained(out) loads."""
    return run("export", quiet=quiet, checkpoint=checkpoint, out=out, tokenizer=tokenizer,
               lowercase=lowercase, cased=cased)


def _read_npy(path):
    """A float32 array of 2 dimensions from a .npy file dmove wrote: (rows, cols, bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise Error(f"{path}: not a .npy file")
    major = data[6]
    if major == 1:
        hlen, start = struct.unpack("<H", data[8:10])[0], 10
    else:
        hlen, start = struct.unpack("<I", data[8:12])[0], 12
    header = data[start:start + hlen].decode("latin1")

    h = ast.literal_eval(header)
    if h.get("descr") != "<f4" or h.get("fortran_order") or len(h.get("shape", ())) != 2:
        raise Error(f"{path}: not a (rows, hidden) float32 array: {header.strip()}")
    rows, cols = h["shape"]
    body = data[start + hlen:]
    if len(body) != rows * cols * 4:
        raise Error(f"{path}: {len(body)} bytes of data for shape ({rows}, {cols})")
    return rows, cols, body


def embed(sentences, model, quiet=True, **options):
    """Sentence embeddings of a Hugging Face BERT (`dmove embed`): one row per sentence,
    in order, as a torch.Tensor (rows, hidden) of float32 (a list of lists where torch is
    not installed). sentences: a string or a list of strings, each one line (no newline
    in it). model: the model's directory. Options as the command's: pooling="mean" or
    "cls", normalize=True or False (default: a sentence-transformers model's own, else
    not), max_length=N, batch=N, threads=N, tokenizer=FILE."""
    if isinstance(sentences, str):
        sentences = [sentences]
    sentences = list(sentences)
    for k, s in enumerate(sentences):
        if not isinstance(s, str):
            raise TypeError(f"sentence {k} is a {type(s).__name__}, not a str")
        if "\n" in s or "\r" in s:
            raise ValueError(f"sentence {k} has a line break: each sentence is one line "
                             "(replace the breaks with spaces first)")
    for key in ("out", "format"):
        if key in options:
            raise TypeError(f"embed() takes no {key}=: it returns the embeddings")
    if options.get("normalize") is False:  # as asked, even where the model normalizes
        del options["normalize"]
        options["no_normalize"] = True
    with tempfile.TemporaryDirectory(prefix="dmove-embed-") as tmp:
        out = os.path.join(tmp, "emb.npy")
        text = "".join(s + "\n" for s in sentences)
        run("embed", "-", quiet=quiet, input=text, model=model, format="npy", out=out, **options)
        if not os.path.isfile(out):
            raise Error(f"{program()} embed wrote no embeddings (is it dmove?)")
        rows, cols, body = _read_npy(out)
    if rows != len(sentences):
        raise Error(f"dmove embed wrote {rows} embeddings for {len(sentences)} sentences")
    try:
        import torch
    except ImportError:
        vals = struct.unpack(f"<{rows * cols}f", body)
        return [list(vals[r * cols:(r + 1) * cols]) for r in range(rows)]
    if not rows:
        return torch.empty(0, cols, dtype=torch.float32)
    return torch.frombuffer(bytearray(body), dtype=torch.float32).reshape(rows, cols)
