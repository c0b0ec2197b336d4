// Each op's inputs and attributes, declared once as data (as ONNX's OpSchema declares its own ops'): the
// registration (GetInputTypeCount, GetInputType, GetInputCharacteristic), the generic validator below (InputCheck:
// presence, element type, rank and shared dims), and the JSON the library exports (OrtllmOpsSchema, read by
// runtime/ops_library.py: the graph builder names the inputs by it) all read the same table. What a table cannot
// say (index values, attribute-dependent requirements) stays in each op's wrapper.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "op_util.h"

namespace ortllm {

// One input. shape: its dims by symbol, comma-separated: a number; "?" (any extent); or a symbol (any other text,
// e.g. "T", "H*D", "ceil(K/32)"), which takes the extent of the first input checked with it (or the value the op
// binds before) and must have that extent in every other input the call checks. "A | B": either form (picked by
// rank). A leading "[n_layers,] " dim is there only when the op's stack attribute is set (OpSchema::stack_attr:
// the input then holds every layer, and the node reads one).
struct InputSpec {
  const char* name;
  ONNXTensorElementDataType type;  // UNDEFINED: the registered variant's (OpSchema::variant_types)
  const char* shape;
  bool optional;
  const char* doc;  // one line
};

struct AttrSpec {
  const char* name;
  const char* type;           // "int", "float", "string" or "ints"
  const char* default_value;  // nullptr: required
  const char* doc;            // one line
};

struct OpSchema {
  const char* name;
  const char* doc;  // what the op computes, one line
  const InputSpec* inputs;
  size_t n_inputs;
  const AttrSpec* attrs;
  size_t n_attrs;
  const char* stack_attr;  // the attribute with which "[n_layers,]" dims are there (nullptr: none)
  const ONNXTensorElementDataType* variant_types;  // an UNDEFINED input's type in each registered variant
  size_t n_variant_types;

  OrtCustomOpInputOutputCharacteristic characteristic(size_t i) const {
    return inputs[i].optional ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                              : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
  }
};

// Whether two names are the same, at compile time: a wrapper's input enum is static_asserted against its table.
constexpr bool same_name(const char* a, const char* b) {
  return *a == *b && (*a == '\0' || same_name(a + 1, b + 1));
}

const char* type_name(ONNXTensorElementDataType type);  // "float32", "float16", "uint8", "int8", "int32", "int64"

// A schema's shapes parsed once (at first use, never per call): each input's forms as dims of symbol ids.
class ParsedSchema {
 public:
  static constexpr int kMaxForms = 2, kMaxSymbols = 32;
  struct Dim {
    int sym;        // >= 0: a symbol's id; kLiteral: `value`; kAny: any extent
    int64_t value;  // the literal's extent
  };
  struct Shape {
    bool stacked = false;  // a leading [n_layers] when the stack attribute is set
    int n_forms = 0;
    int rank[kMaxForms] = {};
    Dim dims[kMaxForms][TensorIn::kMaxRank] = {};
  };
  static constexpr int kLiteral = -1, kAny = -2;

  explicit ParsedSchema(const OpSchema& schema);
  // A symbol's id; an unknown name throws std::logic_error (a wrapper naming a symbol its table lacks).
  int sym(const char* name) const;
  const OpSchema& schema;
  std::vector<std::string> symbols;  // id -> name (n_layers first)
  std::vector<Shape> shapes;         // by input
};

// The generic validator of one call: the symbols' extents so far, and the checks of the inputs the wrapper reads
// (each error names the op, the input and the bad value; an OpError).
class InputCheck {
 public:
  // stacked: the op's stack attribute is set; variant: the element type of the registered variant's UNDEFINED inputs
  InputCheck(const ParsedSchema& parsed, bool stacked,
             ONNXTensorElementDataType variant = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED);
  void bind(int sym, int64_t extent) { extent_[sym] = extent; }
  void unbind(int sym) { extent_[sym] = -1; }
  int64_t operator[](int sym) const { return extent_[sym]; }
  // Input i: absent, an error if the table requires it or `needed_by` (e.g. "epilogue \"residual\"") needs it, else
  // false; present: its element type, rank (form `form` only when >= 0) and dims, binding the symbols it is the first
  // to show; true.
  bool check(size_t i, const TensorIn& in, const char* needed_by = nullptr, int form = -1);
  // "[n_slots, K, r_max]" (forms joined by " or "), as the input's table declares it for this call.
  std::string declared(size_t i, int form = -1) const;

 private:
  const ParsedSchema& parsed_;
  bool stacked_;
  ONNXTensorElementDataType variant_;
  int64_t extent_[ParsedSchema::kMaxSymbols];
};

// Every op's table as JSON: {"abi_version": n, "ops": [{"name", "doc", "stack_attr", "inputs": [{"name", "types",
// "shape", "optional", "doc"}], "attributes": [{"name", "type", "default", "doc"}]}]}.
std::string schemas_json(const OpSchema* const* schemas, size_t n, int abi_version);

}  // namespace ortllm
