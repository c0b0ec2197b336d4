"""ortllm.protocol: the OpenAI request/response protocol, Flask-free, shared by ortllm.service and ortllm.batch.

fields.py      Field / Body: a request field's JSON Schema, what its parser validates with and /openapi.json shows
bodies.py      every route's request body, declared with fields.py (OpenAI, Ollama, tokenizer, adapters)
openai.py      request bodies -> GenerationRequest (prompt, SamplingParams); response shapes, usage, logprobs
structured.py  response_format, vLLM's guided_* fields, tools and tool_choice -> Guide / ToolSpec
tool_calls.py  a reply read as it is generated: text, or tool calls streamed as OpenAI streams them
generation.py  the checks before submit (adapter, prompt length) and the response body of a finished request
errors.py      APIError and the mapping of the runtime's errors onto the OpenAI error envelope
responses.py   OpenAI's Responses API (stateless): its body, translated into a chat body; output items and events
messages.py    Anthropic's Messages API: its body, translated into a chat body; content blocks, events, envelope
embeddings.py  /v1/embeddings, Ollama's /api/embed and /api/embeddings: bodies, input checks, vectors and answers
"""
