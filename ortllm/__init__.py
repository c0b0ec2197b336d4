"""ortllm: small llama-family models with many LoRA adapters on CPUs, on ONNX Runtime."""

__version__ = "0.1.0"
