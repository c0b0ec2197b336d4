"""Embeddings over HTTP on live servers (127.0.0.1): the real `openai` client's embeddings.create (base64, its
default, and float; dimensions; token ids) and the real `ollama` client's embed / embeddings against the real
SmolLM2, each vector the engine's own (bit for bit, as runtime/test_embeddings.py checks across batches); bad
input is a 400 that names the field; /openapi.json documents the three routes."""
from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import ollama
import openai
import pytest

from ortllm.runtime.pooling import normalize

TEXTS = ["The weather is lovely today.", "It is a beautiful day outside.", "The compiler reported a syntax error."]


@pytest.fixture(scope="module")
def oai(smol_live):
    return openai.OpenAI(base_url=smol_live.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def ref(smol_live):
    """The engine's own vectors for TEXTS: normalized and raw."""
    return smol_live.engine.embed(TEXTS), smol_live.engine.embed(TEXTS, normalize=False)


def test_openai_client_base64_and_float(smol_live, oai, ref):
    r = oai.embeddings.create(model=smol_live.model, input=TEXTS)          # the client asks for base64
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == smol_live.model
    np.testing.assert_array_equal(np.array([d.embedding for d in r.data], np.float32), ref[0])
    tokens = sum(len(smol_live.engine.encode_prompt(t)) for t in TEXTS)
    assert r.usage.prompt_tokens == r.usage.total_tokens == tokens
    f = oai.embeddings.create(model=smol_live.model, input=TEXTS[0], encoding_format="float")
    assert len(f.data) == 1
    np.testing.assert_array_equal(np.array(f.data[0].embedding, np.float32), ref[0][0])


def test_openai_client_dimensions_and_token_ids(smol_live, oai, ref):
    r = oai.embeddings.create(model=smol_live.model, input=TEXTS, dimensions=64)
    v = np.array([d.embedding for d in r.data], np.float32)
    assert v.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1, rtol=1e-6)
    np.testing.assert_array_equal(v, normalize(ref[1], 64))
    ids = [smol_live.engine.encode_prompt(t) for t in TEXTS]
    one = oai.embeddings.create(model=smol_live.model, input=ids[1])                        # a list of ints
    many = oai.embeddings.create(model=smol_live.model, input=ids)                          # a list of lists
    np.testing.assert_array_equal(np.array(one.data[0].embedding, np.float32), ref[0][1])
    np.testing.assert_array_equal(np.array([d.embedding for d in many.data], np.float32), ref[0])


def test_last_token_pooling_extension(smol_live, oai):
    r = oai.embeddings.create(model=smol_live.model, input=TEXTS, extra_body={"pooling": "last"})
    np.testing.assert_array_equal(np.array([d.embedding for d in r.data], np.float32),
                                  smol_live.engine.embed(TEXTS, pooling="last"))


def test_concurrent_requests_beside_a_generation_get_the_same_vectors(smol_live, oai, ref):
    stream = oai.chat.completions.create(model=smol_live.model, messages=[{"role": "user", "content": "Count to 50"}],
                                         max_tokens=48, temperature=0, stream=True)
    def one(i):
        return oai.embeddings.create(model=smol_live.model, input=TEXTS[i % 3]).data[0].embedding

    with cf.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(one, range(12)))
    assert sum(1 for _ in stream) > 1
    for i, e in enumerate(got):
        np.testing.assert_array_equal(np.array(e, np.float32), ref[0][i % 3])


def test_ollama_client_embed_and_embeddings(smol_live, ref):
    client = ollama.Client(host=smol_live.url)
    r = client.embed(model=smol_live.model, input=TEXTS)
    np.testing.assert_array_equal(np.array(r.embeddings, np.float32), ref[0])
    assert r.prompt_eval_count == sum(len(smol_live.engine.encode_prompt(t)) for t in TEXTS)
    one = client.embed(model=smol_live.model, input=TEXTS[2], dimensions=32)
    np.testing.assert_array_equal(np.array(one.embeddings, np.float32), normalize(ref[1][2:], 32))
    old = client.embeddings(model=smol_live.model, prompt=TEXTS[0])          # the older route: not normalized
    np.testing.assert_array_equal(np.array(old.embedding, np.float32), ref[1][0])
    assert client.embed(model=smol_live.model, input=[]).embeddings == []    # Ollama's way to load a model


def test_ollama_truncates_unless_told_not_to(smol_live):
    client = ollama.Client(host=smol_live.url)
    engine = smol_live.engine
    room = min(engine.context_length, engine.stats()["kv_blocks_total"] * engine.config.cache.block_size)
    long = "word " * (room + 100)
    cut = client.embed(model=smol_live.model, input=long)
    assert len(cut.embeddings[0]) == engine.runner.hidden_size
    assert cut.prompt_eval_count == room                                    # cut to what fits
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model=smol_live.model, input=long, truncate=False)
    assert e.value.status_code == 400 and "shorten it" in str(e.value)


BAD = [
    ({"input": []}, "input", "input must be a non-empty string"),
    ({"input": ""}, "input", "input must be a non-empty string"),
    ({"input": ["ok", ""]}, "input", "input must be a non-empty string"),
    ({"input": 5}, "input", "input must be"),
    ({"input": [1, "a"]}, "input", "input must be"),
    ({"input": [[1, 2], []]}, "input", "input must be"),
    ({"input": ["x"] * 257}, "input", "input must be"),
    ({"input": "x", "dimensions": 0}, "dimensions", "dimensions must be >= 1"),
    ({"input": "x", "dimensions": 65}, "dimensions", "dimensions must be in [1, 64]"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "encoding_format must be one of"),
    ({"input": "x", "pooling": "cls"}, "pooling", "pooling must be one of"),
    ({"input": [10**9]}, "input", "token ids must be in [0,"),
]


@pytest.mark.parametrize("body,param,message", BAD, ids=[str(b)[:40] for b, _, _ in BAD])
def test_bad_input_is_a_400_that_names_it(tiny_live, body, param, message):
    r = tiny_live.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"], err


def test_input_longer_than_the_context_is_a_400(tiny_live):
    ctx = tiny_live.engine.context_length
    r = tiny_live.post("/v1/embeddings", json={"input": [[1, 2, 3], [1] * (ctx + 1)]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "input" and err["code"] == "context_length_exceeded"
    assert f"input[1] has {ctx + 1} tokens but at most {ctx} fit" in err["message"]
    ok = tiny_live.post("/v1/embeddings", json={"input": [1] * ctx})        # the whole context: fine
    assert ok.status_code == 200, ok.text
    unknown = tiny_live.post("/v1/embeddings", json={"input": "x", "model": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    s = tiny_live.engine.stats()
    assert tiny_live.wait_idle_kv(0) == 0, s


def test_ollama_bad_input(tiny_live):
    r = tiny_live.post("/api/embed", json={"model": tiny_live.model, "input": [1, 2]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
    r = tiny_live.post("/api/embed", data=b'{"input": "x"}')                # no Content-Type, as curl -d sends
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text


def test_openapi_documents_the_routes(tiny_live):
    spec = tiny_live.get("/openapi.json").json()
    for path, body in (("/v1/embeddings", "EmbeddingRequest"), ("/api/embed", "OllamaEmbedRequest"),
                       ("/api/embeddings", "OllamaEmbeddingsRequest")):
        op = spec["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(body)
    props = spec["components"]["schemas"]["EmbeddingRequest"]["properties"]
    assert {"input", "model", "encoding_format", "dimensions", "pooling"} <= set(props)
