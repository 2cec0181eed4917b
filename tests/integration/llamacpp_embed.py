"""llama.cpp's embeddings of texts, the reference of test_embeddings_parity.py: mean-pooled and
L2-normalized by llama.cpp itself (llama_cpp.Llama with embedding=True and mean pooling, the path
llama-embedding and llama-server's /v1/embeddings take). Run with PYTHONPATH and LLAMA_CPP_LIB_PATH
naming a build of tests/tools/build_llamacpp.sh.
  llamacpp_embed.py MODEL.gguf TEXTS.json OUT.json   (OUT: {"tokens": [[ids]], "embeddings": [[floats]]})"""
import json
import sys

import llama_cpp

model, texts_path, out_path = sys.argv[1:4]
texts = json.load(open(texts_path))
llm = llama_cpp.Llama(model_path=model, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_ctx=1024,
                      n_batch=1024, n_ubatch=1024, n_threads=2, verbose=False)
out = {"tokens": [], "embeddings": []}
for t in texts:
    out["tokens"].append(llm.tokenize(t.encode(), add_bos=True, special=False))
    out["embeddings"].append(llm.embed(t, normalize=True))
json.dump(out, open(out_path, "w"))
