"""ortllm.protocol: the OpenAI request/response protocol, Flask-free, shared by ortllm.service and ortllm.batch.

openai.py      request bodies -> GenerationRequest (prompt, SamplingParams); response shapes, usage, logprobs
generation.py  the checks before submit (adapter, prompt length) and the response body of a finished request
errors.py      APIError and the mapping of the runtime's errors onto the OpenAI error envelope
"""
