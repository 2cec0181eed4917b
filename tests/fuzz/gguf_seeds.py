"""Writes the gguf harness's seed images into DIR with the gguf package's writer (never committed:
model-format files are generated, not checked in): two tiny files, a byte-level BPE and a
SentencePiece vocabulary, each with every metadata value type and an F32 and an F16 tensor.
usage: gguf_seeds.py DIR"""
import os
import sys

import numpy as np
from gguf import GGUFWriter


def write(path, model, pre, tokens, types, bpe):
    w = GGUFWriter(path, "llama")
    w.add_string("tokenizer.ggml.model", model)
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    if bpe:
        w.add_array("tokenizer.ggml.merges", ["a b", "\u0120 a"])
    else:
        w.add_array("tokenizer.ggml.scores", [0.0, 0.0, 0.0, 0.0, -1.0, -2.0])
    w.add_uint32("tokenizer.ggml.bos_token_id", 0)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)
    w.add_array("general.tags", [[1, 2, 3]])
    w.add_float32("test.f", 0.5)
    w.add_int64("test.i", -3)
    w.add_bool("test.b", True)
    w.add_tensor("t.weight", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.add_tensor("t.half", np.arange(4, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


out = sys.argv[1]
os.makedirs(out, exist_ok=True)
write(os.path.join(out, "bpe.gguf"), "gpt2", "smollm",
      ["<|im_start|>", "<|im_end|>", "a", "b", "ab", "\u0120", "\u0120a"], [3, 3, 1, 1, 1, 1, 1], True)
write(os.path.join(out, "spm.gguf"), "llama", "default",
      ["<unk>", "<s>", "</s>", "<0x41>", "\u2581a", "b"], [2, 3, 3, 6, 1, 1], False)
