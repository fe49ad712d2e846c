"""dmove in Python: dmove's fused BERT encoder layer as a PyTorch module, and its
whole-model commands.

    import dmove.torch
    dmove.torch.patch(model)   # every transformers BertLayer runs on dmove

    import dmove
    dmove.pretrain(data="shards/", tokenizer="vocab.txt", lowercase=True, steps=1000,
                   export="model/")
    dmove.embed(["a sentence"], model="model/")   # a (1, hidden) torch.Tensor

See the README's sections "In PyTorch: dmove.torch.patch" and "From Python: the whole
model".
"""
from ._lib import Error, library_path
from .commands import embed, export, finetune, prepare, pretrain, program, run

__version__ = "0.1.0"
__all__ = ["Error", "library_path", "__version__", "embed", "export", "finetune", "prepare", "pretrain",
           "program", "run"]
