"""The contract between the build pipeline and the runtime: artifact files, graph I/O names and shapes.

Imported by the graph builder and the runtime alike (STYLE.md 2). An artifact whose manifest carries
another FORMAT_VERSION or CONTRACT_VERSION is refused at load, by name.
"""

FORMAT_VERSION = 1          # layout of the artifact directory and manifest.json
CONTRACT_VERSION = 1        # graph input/output names, shapes and semantics below

# ---- artifact files
MANIFEST = "manifest.json"
MODEL = "model.onnx"
MODEL_DATA = "model.onnx.data"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION = "generation.json"
CONFIG = "config.json"      # the llama config (ModelConfig.to_dict)

GRAPH_KINDS = ("engine", "portable")

# ---- the portable graph (stock ONNX ops, plain KV cache; any ONNX Runtime client can run it)
# Same convention as optimum / onnxruntime-genai decoder exports:
#   input_ids       [batch, seq]              int64
#   attention_mask  [batch, past + seq]       int64  (1 = attend, 0 = padding)
#   position_ids    [batch, seq]              int64
#   past_key_values.{i}.key|value  [batch, kv_heads, past, head_dim]  float32
# ->
#   logits          [batch, seq, vocab]       float32
#   present.{i}.key|value          [batch, kv_heads, past + seq, head_dim]  float32
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"


def past_key(layer: int) -> str:
    return f"past_key_values.{layer}.key"


def past_value(layer: int) -> str:
    return f"past_key_values.{layer}.value"


def present_key(layer: int) -> str:
    return f"present.{layer}.key"


def present_value(layer: int) -> str:
    return f"present.{layer}.value"
