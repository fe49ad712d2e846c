"""bench/gpu/sass_loops.py SASS [SASS ...]: each flash kernel's main loop (its longest
backward branch around HMMA instructions) in cuobjdump -sass text: instructions in all, and
by kind. Static counts: a loop's branches to paths a tile may skip (edge tiles' masks, J % 4
!= 0's dropout words, the keymask's loads) are counted too. Used by bench/gpu/sass.sh."""
import collections
import re
import sys

KINDS = ["HMMA", "MUFU", "ISETP", "BSSY", "BRA", "IMAD", "LOP3", "FFMA", "FMUL", "FADD", "LDS", "LDSM",
         "SHFL", "STL", "LDL"]


def functions(text):
    for part in re.split(r"\n\s*Function : ", text)[1:]:
        name = part.split("\n", 1)[0].strip()
        code = [(int(m.group(1), 16), m.group(2).strip())
                for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", part)]
        yield name, code


def opcode(text):
    words = text.split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def main_loop(code):
    index = {a: i for i, (a, _) in enumerate(code)}
    best = None
    for i, (a, text) in enumerate(code):
        m = re.search(r"BRA (?:!?U?P\d, )?(0x[0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target < a and target in index:
            j = index[target]
            if any(opcode(t) == "HMMA" for _, t in code[j:i + 1]) and (best is None or i - j > best[1] - best[0]):
                best = (j, i)
    return code[best[0]:best[1] + 1] if best else []


def short(name):
    m = re.match(r"_Z\d+(fl_\w+?_kernel)I(?:\d+)?(\w+?)(?:Li(\d+)E)?E", name)
    if not m:
        return name
    dtype = "bf16" if "bfloat16" in m.group(2) else "fp16" if "half" in m.group(2) else m.group(2)
    return f"{m.group(1)} {dtype}" + (f" P={m.group(3)}" if m.group(3) else "")


for path in sys.argv[1:]:
    print(f"== {path}")
    print(f"{'kernel':34s} {'loop':>5s} " + " ".join(f"{k:>5s}" for k in KINDS))
    for name, code in functions(open(path).read()):
        if not re.search(r"fl_(fwd|fwd2|bwd|dq)_kernel", name):
            continue
        body = main_loop(code)
        count = collections.Counter(opcode(t) for _, t in body)
        print(f"{short(name):34s} {len(body):5d} " + " ".join(f"{count[k]:5d}" for k in KINDS))
