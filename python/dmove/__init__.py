"""dmove in Python: dmove's fused BERT encoder layer as a PyTorch module.

    import dmove.torch
    dmove.torch.patch(model)   # every transformers BertLayer runs on dmove

See the README's section "In PyTorch: dmove.torch.patch".
"""
from ._lib import Error, library_path

__version__ = "0.1.0"
__all__ = ["Error", "library_path", "__version__"]
