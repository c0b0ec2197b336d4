// The tables' parser, the generic validator and the JSON export (op_schema.h).
#include "op_schema.h"

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace ortllm {
namespace {

constexpr const char* kStackPrefix = "[n_layers,]";

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(' '), b = s.find_last_not_of(' ');
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) out.push_back(trim(part));
  return out;
}

bool is_number(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

void json_string(std::ostringstream& o, const char* s) {
  if (s == nullptr) {
    o << "null";
    return;
  }
  o << '"';
  for (const char* p = s; *p; ++p) {
    if (*p == '"' || *p == '\\')
      o << '\\' << *p;
    else
      o << *p;
  }
  o << '"';
}

}  // namespace

const char* type_name(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
      return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
      return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
      return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
      return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
      return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
      return "int64";
    default:
      return "?";
  }
}

ParsedSchema::ParsedSchema(const OpSchema& s) : schema(s), symbols{"n_layers"}, shapes(s.n_inputs) {
  for (size_t i = 0; i < s.n_inputs; ++i) {
    std::string text = trim(s.inputs[i].shape);
    Shape& shape = shapes[i];
    if (text.rfind(kStackPrefix, 0) == 0) {
      shape.stacked = true;
      text = text.substr(std::strlen(kStackPrefix));
    }
    const std::vector<std::string> forms = split(text, '|');
    if (forms.size() > static_cast<size_t>(kMaxForms))
      throw std::logic_error(std::string(s.name) + ": input " + s.inputs[i].name + " declares too many forms");
    shape.n_forms = static_cast<int>(forms.size());
    for (size_t f = 0; f < forms.size(); ++f) {
      const std::vector<std::string> dims = split(forms[f], ',');
      if (dims.size() + (shape.stacked ? 1 : 0) > static_cast<size_t>(TensorIn::kMaxRank))
        throw std::logic_error(std::string(s.name) + ": input " + s.inputs[i].name + " declares too many dims");
      shape.rank[f] = static_cast<int>(dims.size());
      for (size_t d = 0; d < dims.size(); ++d) {
        Dim& dim = shape.dims[f][d];
        if (dims[d] == "?") {
          dim = {kAny, 0};
        } else if (is_number(dims[d])) {
          dim = {kLiteral, std::atoll(dims[d].c_str())};
        } else {
          size_t id = 0;
          while (id < symbols.size() && symbols[id] != dims[d]) ++id;
          if (id == symbols.size()) symbols.push_back(dims[d]);
          dim = {static_cast<int>(id), 0};
        }
      }
    }
  }
  if (symbols.size() > static_cast<size_t>(kMaxSymbols))
    throw std::logic_error(std::string(s.name) + ": its table names too many symbols");
}

int ParsedSchema::sym(const char* name) const {
  for (size_t id = 0; id < symbols.size(); ++id)
    if (symbols[id] == name) return static_cast<int>(id);
  throw std::logic_error(std::string(schema.name) + ": no symbol '" + name + "' in its table");
}

InputCheck::InputCheck(const ParsedSchema& parsed, bool stacked, ONNXTensorElementDataType variant)
    : parsed_(parsed), stacked_(stacked), variant_(variant) {
  for (int64_t& e : extent_) e = -1;
}

std::string InputCheck::declared(size_t i, int form) const {
  const ParsedSchema::Shape& shape = parsed_.shapes[i];
  const bool stacked = shape.stacked && stacked_;
  std::ostringstream o;
  for (int f = 0; f < shape.n_forms; ++f) {
    if (form >= 0 && f != form) continue;
    if (o.tellp() > 0) o << " or ";
    o << "[" << (stacked ? "n_layers" : "");
    for (int d = 0; d < shape.rank[f]; ++d) {
      const ParsedSchema::Dim& dim = shape.dims[f][d];
      o << (d > 0 || stacked ? ", " : "");
      if (dim.sym >= 0)
        o << parsed_.symbols[dim.sym];
      else if (dim.sym == ParsedSchema::kLiteral)
        o << dim.value;
      else
        o << "?";
    }
    o << "]";
  }
  if (stacked) o << " (attribute " << parsed_.schema.stack_attr << ")";
  return o.str();
}

bool InputCheck::check(size_t i, const TensorIn& in, const char* needed_by, int form) {
  const OpSchema& s = parsed_.schema;
  const InputSpec& spec = s.inputs[i];
  if (in.value == nullptr) {
    if (needed_by != nullptr) fail(s.name, ": ", needed_by, " needs input '", spec.name, "' ", declared(i, form));
    if (!spec.optional) fail(s.name, ": input '", spec.name, "' is required");
    return false;
  }
  const ONNXTensorElementDataType type = spec.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED ? variant_ : spec.type;
  if (in.type != type)
    fail(s.name, ": input '", spec.name, "' must be ", type_name(type), " (ONNX element type ", type,
         "); got element type ", in.type);
  const ParsedSchema::Shape& shape = parsed_.shapes[i];
  const int lead = shape.stacked && stacked_ ? 1 : 0;
  int f = 0;
  while (f < shape.n_forms && ((form >= 0 && f != form) || shape.rank[f] + lead != in.rank)) ++f;
  if (f == shape.n_forms)
    fail(s.name, ": input '", spec.name, "' must be ", declared(i, form), "; got shape ", shape_str(in.shape()));
  // The symbols this input shows first take its extents; then every dim must be what the call has so far.
  if (lead && extent_[0] < 0) extent_[0] = in.dims[0];
  for (int d = 0; d < shape.rank[f]; ++d) {
    const ParsedSchema::Dim& dim = shape.dims[f][d];
    if (dim.sym >= 0 && extent_[dim.sym] < 0) extent_[dim.sym] = in.dims[lead + d];
  }
  int64_t want[TensorIn::kMaxRank];
  if (lead) want[0] = extent_[0];
  for (int d = 0; d < shape.rank[f]; ++d) {
    const ParsedSchema::Dim& dim = shape.dims[f][d];
    want[lead + d] = dim.sym >= 0 ? extent_[dim.sym] : dim.sym == ParsedSchema::kLiteral ? dim.value : -1;
  }
  expect(s.name, spec.name, in, want, static_cast<size_t>(lead + shape.rank[f]));
  return true;
}

std::string schemas_json(const OpSchema* const* schemas, size_t n, int abi_version) {
  std::ostringstream o;
  o << "{\"abi_version\": " << abi_version << ", \"ops\": [";
  for (size_t k = 0; k < n; ++k) {
    const OpSchema& s = *schemas[k];
    o << (k ? ", " : "") << "{\"name\": ";
    json_string(o, s.name);
    o << ", \"doc\": ";
    json_string(o, s.doc);
    o << ", \"stack_attr\": ";
    json_string(o, s.stack_attr);
    o << ", \"inputs\": [";
    for (size_t i = 0; i < s.n_inputs; ++i) {
      const InputSpec& in = s.inputs[i];
      o << (i ? ", " : "") << "{\"name\": ";
      json_string(o, in.name);
      o << ", \"types\": [";
      if (in.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED) {
        for (size_t v = 0; v < s.n_variant_types; ++v) {
          o << (v ? ", " : "");
          json_string(o, type_name(s.variant_types[v]));
        }
      } else {
        json_string(o, type_name(in.type));
      }
      o << "], \"shape\": ";
      json_string(o, in.shape);
      o << ", \"optional\": " << (in.optional ? "true" : "false") << ", \"doc\": ";
      json_string(o, in.doc);
      o << "}";
    }
    o << "], \"attributes\": [";
    for (size_t a = 0; a < s.n_attrs; ++a) {
      const AttrSpec& at = s.attrs[a];
      o << (a ? ", " : "") << "{\"name\": ";
      json_string(o, at.name);
      o << ", \"type\": ";
      json_string(o, at.type);
      o << ", \"default\": ";
      json_string(o, at.default_value);
      o << ", \"doc\": ";
      json_string(o, at.doc);
      o << "}";
    }
    o << "]}";
  }
  o << "]}";
  return o.str();
}

}  // namespace ortllm
