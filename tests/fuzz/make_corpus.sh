#!/bin/sh
# tests/fuzz/make_corpus.sh DMOVE: writes the fuzzers' seed corpora, tests/fuzz/corpus/NAME/:
# a few small valid files of each format (made by dmove itself where it writes the format:
# checkpoints, plans, shards, dataset manifests) and a few broken ones. Python 3 crafts
# the rest. Run from the repository root; the result is committed (under 300 KB in all).
set -eu
DMOVE=${1:?usage: tests/fuzz/make_corpus.sh path/to/dmove}
C=tests/fuzz/corpus
T=$(mktemp -d "${TMPDIR:-/tmp}/dmove-corpus.XXXXXX")
trap 'rm -rf "$T"' EXIT
rm -rf "$C"
mkdir -p "$C"/safetensors "$C"/checkpoint "$C"/plan "$C"/profile "$C"/tunecache "$C"/tokenizer \
         "$C"/shard "$C"/dataset "$C"/hfconfig
export OMP_NUM_THREADS=1

# checkpoints of the harness's trainer (fuzz_checkpoint.c): byte 0 picks the loader
"$DMOVE" train --layers 1 --batch 1 --seq 2 --hidden 8 --heads 2 --ffn 16 --steps 2 --save "$T/run.ckpt" >/dev/null
{ printf '\000'; cat "$T/run.ckpt"; } > "$C/checkpoint/ckpt"
{ printf '\001'; cat "$T/run.ckpt"; } > "$C/checkpoint/params"
{ printf '\000'; head -c 3000 "$T/run.ckpt"; } > "$C/checkpoint/ckpt_truncated"
"$DMOVE" train --layers 2 --batch 1 --seq 2 --hidden 8 --heads 2 --ffn 16 --steps 1 --save "$T/two.ckpt" >/dev/null
{ printf '\000'; cat "$T/two.ckpt"; } > "$C/checkpoint/ckpt_two_layers"

# plans for the harness's layer (fuzz_plan.c)
"$DMOVE" tune --batch 2 --seq 8 --hidden 16 --heads 2 --ffn 32 --threads 1 --reps 1 --verify 1 --no-cache \
    --out "$C/plan/tuned.json" >/dev/null 2>&1
head -c 200 "$C/plan/tuned.json" > "$C/plan/truncated.json"

# a dataset of a tiny vocabulary: its manifest and shards
head -n 1000 tests/text/tok/bert-base-uncased-vocab.txt > "$T/vocab.txt"
for d in 1 2 3 4 5 6; do printf 'the cat sat on the mat %s .\nit was a good day !\n\n' $d; done > "$T/a.txt"
printf 'another document , with words\nand lines\n' >> "$T/a.txt"
"$DMOVE" prepare --tokenizer "$T/vocab.txt" --lowercase --out "$T/ds" --valid-fraction 0.3 --quiet "$T/a.txt" >/dev/null
cp "$T/ds/dataset.json" "$C/dataset/dataset.json"
for f in "$T"/ds/*.shard; do cp "$f" "$C/shard/$(basename "$f")"; done
head -c 40 "$T/ds/dataset.json" > "$C/dataset/truncated.json"

python3 - "$C" "$T/vocab.txt" <<'PY'
import json, struct, sys
C, vocab = sys.argv[1], sys.argv[2]

def st(tensors, meta=None):
    """tensors: (name, dtype, shape, bytes); a safetensors file."""
    h, off, data = {}, 0, b''
    if meta is not None: h['__metadata__'] = meta
    for name, dt, shape, b in tensors:
        h[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + len(b)]}
        off += len(b); data += b
    j = json.dumps(h).encode()
    return struct.pack('<Q', len(j)) + j + data

def w(path, b):
    open(path, 'wb').write(b if isinstance(b, bytes) else b.encode())

S = C + '/safetensors/'
w(S + 'f32', st([('a', 'F32', [2, 3], struct.pack('<6f', *range(6))), ('b', 'F32', [4], struct.pack('<4f', 1, 2, 3, 4))],
                {'format': 'pt'}))
sizes = {'F64': 8, 'F16': 2, 'BF16': 2, 'I64': 8, 'I32': 4, 'I16': 2, 'I8': 1, 'U8': 1, 'BOOL': 1}
w(S + 'dtypes', st([(d.lower(), d, [3], bytes(range(1, 1 + 3 * n))) for d, n in sizes.items()] +
                   [('scalar', 'F32', [], struct.pack('<f', 7)), ('empty', 'F32', [0, 5], b'')]))
good = st([('x', 'F32', [2], struct.pack('<2f', 1, 2))])
w(S + 'truncated', good[:-3])
w(S + 'header_too_long', struct.pack('<Q', 1 << 40) + good[8:])
w(S + 'overlap', st([('a', 'F32', [2], b'\0' * 8), ('b', 'F32', [2], b'\0' * 8)]).replace(b'[8, 16]', b'[4, 12]'))
w(S + 'shape_mismatch', st([('a', 'F32', [3], b'\0' * 8)]))
w(S + 'bad_dtype', st([('a', 'Q7', [2], b'\0' * 8)]))
w(S + 'dup', struct.pack('<Q', 90) + b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}   '[:90] + b'\0')
w(S + 'empty', b'')

P = C + '/profile/'
prof = {'version': 1, 'machine': {'cpu': 'AMD EPYC', 'host': 'h'}, 'date': '2026-11-27', 'dmove_version': '0',
        'threads': 2, 'bandwidth_gbs': {'triad': 20.5, 'read': 30.1}, 'vector_gflops': 150.0, 'sgemm_n': 1024,
        'sgemm': [{'threads': 1, 'gflops': 80.0}, {'threads': 2, 'gflops': 150.0}]}
w(P + 'valid.json', json.dumps(prof))
bad = dict(prof); bad['sgemm'] = [{'threads': 3, 'gflops': 1}]
w(P + 'bad_threads.json', json.dumps(bad))
bad = dict(prof); bad['version'] = 2
w(P + 'version.json', json.dumps(bad))
w(P + 'truncated.json', json.dumps(prof)[:60])
kern = json.loads(json.dumps(prof)); kern['sgemm'][1]['direct_gflops'] = 420.0; kern['direct_kernel'] = 'amx'
w(P + 'direct.json', json.dumps(kern))
kern['direct_kernel'] = 'avx512$%n'
w(P + 'direct_badname.json', json.dumps(kern))

U = C + '/tunecache/'
w(U + 'valid.tsv', '# dmove tune cache v1\ncpu|b2|j8|i16|h2|u32|g0|c0\t0.000123\ncpu|b2|j8|i16|h2|u32|g0|c1\t0.0002\n'
                   'cpu|b2|j8|i16|h2|u32|g0|c0\t0.0001\n')
w(U + 'hostile.tsv', 'a\tnan\r\nb\t-1\nc\tabc\nd\t1e308\ne\tinf\nf\t1e-310\n\tx\nnotab\ng\t0.5\r\n' + 'h' * 2100 + '\t1\ntorn\t0.')
w(U + 'empty.tsv', '')

K = C + '/tokenizer/'
v = open(vocab, encoding='utf-8').read().split('\n')[:120]
w(K + 'vocab_lower', b'\x03' + '\n'.join(v).encode() + b'\n')
w(K + 'vocab_cased', b'\x01' + '\n'.join(v[:110] + ['Hello', '##lo', 'caf\u00e9', '\u4e2d']).encode() + b'\n')
w(K + 'vocab_dup', b'\x01' + '\n'.join(v[:30] + v[:5]).encode())
w(K + 'vocab_bad_utf8', b'\x01[PAD]\n[UNK]\n\xff\xfe\n')
vocab_map = {t: i for i, t in enumerate(v)}
tj = {'version': '1.0', 'truncation': None, 'padding': None,
      'added_tokens': [{'id': vocab_map[t], 'special': True, 'content': t, 'single_word': False, 'lstrip': False,
                        'rstrip': False, 'normalized': False} for t in ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] if t in vocab_map],
      'normalizer': {'type': 'BertNormalizer', 'clean_text': True, 'handle_chinese_chars': True,
                     'strip_accents': None, 'lowercase': True},
      'pre_tokenizer': {'type': 'BertPreTokenizer'}, 'post_processor': None, 'decoder': None,
      'model': {'type': 'WordPiece', 'unk_token': '[UNK]', 'continuing_subword_prefix': '##',
                'max_input_chars_per_word': 100, 'vocab': vocab_map}}
w(K + 'json', b'\x00' + json.dumps(tj, ensure_ascii=False).encode())
tj2 = json.loads(json.dumps(tj)); tj2['model']['type'] = 'BPE'
w(K + 'json_bpe', b'\x00' + json.dumps(tj2).encode())
tj3 = json.loads(json.dumps(tj)); tj3['model']['vocab']['extra'] = 5000
w(K + 'json_hole', b'\x00' + json.dumps(tj3).encode())
tj4 = json.loads(json.dumps(tj)); tj4['normalizer'] = {'type': 'Sequence', 'normalizers': []}; tj4['added_tokens'].append(
    {'id': 200, 'special': False, 'content': 'new tok', 'single_word': False, 'lstrip': True, 'rstrip': True, 'normalized': True})
w(K + 'json_added', b'\x00' + json.dumps(tj4).encode())

H = C + '/hfconfig/'
cfg = {'architectures': ['BertForMaskedLM'], 'attention_probs_dropout_prob': 0.1, 'hidden_act': 'gelu',
       'hidden_dropout_prob': 0.1, 'hidden_size': 768, 'initializer_range': 0.02, 'intermediate_size': 3072,
       'layer_norm_eps': 1e-12, 'max_position_embeddings': 512, 'model_type': 'bert', 'num_attention_heads': 12,
       'num_hidden_layers': 12, 'pad_token_id': 0, 'position_embedding_type': 'absolute', 'type_vocab_size': 2,
       'vocab_size': 30522}
w(H + 'bert-base.json', json.dumps(cfg, indent=2))
small = dict(cfg, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=2, vocab_size=100,
             hidden_act='gelu_new', attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
w(H + 'small.json', json.dumps(small))
w(H + 'heads.json', json.dumps(dict(cfg, num_attention_heads=7)))
w(H + 'roberta.json', json.dumps(dict(cfg, model_type='roberta', hidden_act='swish')))
w(H + 'types.json', json.dumps(dict(cfg, hidden_size='768', layer_norm_eps=None)))
w(H + 'truncated.json', json.dumps(cfg)[:100])
PY
du -sh "$C"; du -sb "$C" | awk '{ if ($1 > 300000) { print "corpus over 300 KB"; exit 1 } }'
