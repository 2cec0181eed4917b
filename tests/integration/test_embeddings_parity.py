"""POST /v1/embeddings against llama.cpp on the same GGUF file (docs/router.md, "Embeddings API"):
the mean-pooled, L2-normalized embeddings of a few texts from a router + a worker started with
--embeddings, and llama.cpp's of the same texts (tests/integration/llamacpp_embed.py over the
library tests/tools/build_llamacpp.sh builds for the `models/generate` fixture). Both tokenize the
texts the same way, and every pair of vectors has a cosine similarity of at least MIN_COSINE.

llama.cpp's library comes from SY_LLAMACPP_DIR, else SY_BUILD_DIR/llama.cpp (the fixture's), else
build/llama.cpp-bench (tests/bench/setup_llamacpp.sh); without one the module skips with the
reason (a failure when CI is set: conftest.py)."""
import json
import os
import subprocess
import sys

import openai
import pytest

from cluster import MODEL_ID, Router
from support import needs_model
from worker_client import BUILD, MODEL, ROOT, Worker

# Measured on SmolLM2-135M Q4_1 with the AMX and the AVX2 kernels alike: 0.9988 for the shortest
# text, 0.9997 to 0.9999 for the others. The worker's prompt GEMM runs on bf16 activations and
# llama.cpp's on 8-bit quantized ones, so the vectors are close, not equal; the bound leaves about
# eight times the largest gap measured.
MIN_COSINE = 0.99

TEXTS = [
    "The cat sat on the mat.",
    "How do I bake bread at home?",
    "Quarterly revenue rose by eight percent, driven by strong sales in Europe and Asia.",
    "Hello",
    "def add(a, b):\n    return a + b\n",
    "Embeddings map a text to a vector; texts that mean the same thing land close together. " * 6,
]


def llamacpp_dir():
    for d in (os.environ.get("SY_LLAMACPP_DIR"), os.path.join(BUILD, "llama.cpp"),
              os.path.join(ROOT, "build", "llama.cpp-bench")):
        if d and os.path.isdir(os.path.join(d, "lib")) and os.path.isdir(os.path.join(d, "python", "llama_cpp")):
            return d
    return None


LCPP = llamacpp_dir()
pytestmark = [
    needs_model,
    pytest.mark.skipif(LCPP is None, reason="no llama.cpp library (ctest -R models/generate builds it: "
                                            "tests/tools/build_llamacpp.sh)"),
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity")
    (d / "texts.json").write_text(json.dumps(TEXTS))
    env = dict(os.environ, PYTHONPATH=os.path.join(LCPP, "python"), LLAMA_CPP_LIB_PATH=os.path.join(LCPP, "lib"))
    subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "llamacpp_embed.py"), MODEL,
                    str(d / "texts.json"), str(d / "out.json")], env=env, check=True, timeout=600)
    return json.loads((d / "out.json").read_text())


@pytest.fixture(scope="module")
def client():
    w = Worker("--embeddings", "--max-context", "1024")
    r = Router([w.endpoint])
    yield openai.OpenAI(base_url=r.url + "/v1", api_key="none", max_retries=0, timeout=300)
    r.stop()
    w.stop()


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


def test_the_same_tokens(client, reference):
    """The texts tokenize as llama.cpp tokenizes them (the router's tokenizer, BOS as the model adds it)."""
    for text, ids in zip(TEXTS, reference["tokens"]):
        assert client.embeddings.create(model=MODEL_ID, input=text).usage.prompt_tokens == len(ids), text


def test_mean_pooled_embeddings_match_llama_cpp(client, reference):
    ours = client.embeddings.create(model=MODEL_ID, input=TEXTS, encoding_format="float").data
    by_ids = client.embeddings.create(model=MODEL_ID, input=reference["tokens"], encoding_format="float").data
    cosines = [cosine(o.embedding, ref) for o, ref in zip(ours, reference["embeddings"])]
    print("cosine to llama.cpp per text:", " ".join(f"{c:.6f}" for c in cosines))
    for o, i in zip(ours, by_ids):
        assert o.embedding == i.embedding  # the texts' tokens are llama.cpp's tokens
    assert len(ours[0].embedding) == len(reference["embeddings"][0])
    assert min(cosines) >= MIN_COSINE, cosines
