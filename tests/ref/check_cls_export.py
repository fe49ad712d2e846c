#!/usr/bin/env python3
"""check_cls_export.py: loads a `dmove finetune --export DIR` with transformers'
BertForSequenceClassification.from_pretrained, strictly (no key missing, left over or of
another shape), and scores a JSONL file of {"text", "label"} with it: the accuracy and mean
loss should be dmove's held-out figures for that file. A check by hand (CI has no Python).

Usage: python3 tests/ref/check_cls_export.py DIR VOCAB_TXT EVAL_JSONL [SEQ]
"""
import json, sys, torch
from transformers import BertForSequenceClassification, BertTokenizer
m, info = BertForSequenceClassification.from_pretrained(sys.argv[1], output_loading_info=True)
print("loading info:", info)
assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
print("id2label", m.config.id2label, "num_labels", m.config.num_labels)
tok = BertTokenizer(sys.argv[2], do_lower_case=True)
data = [json.loads(l) for l in open(sys.argv[3])]
e = tok([d["text"] for d in data], padding="max_length", truncation=True, max_length=int(sys.argv[4]) if len(sys.argv) > 4 else 128, return_tensors="pt")
m.eval()
with torch.no_grad():
    lg = m(**e).logits
y = torch.tensor([m.config.label2id[d["label"]] for d in data])
loss = torch.nn.functional.cross_entropy(lg.double(), y)
print(f"transformers on the export: accuracy {(lg.argmax(-1) == y).float().mean():.4f}, loss {loss:.4f}")
