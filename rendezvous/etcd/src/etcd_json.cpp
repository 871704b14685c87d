#include "etcd_json.hpp"

#include <charconv>

#include "drun/common/error.hpp"
#include "drun/common/safe_text.hpp"

namespace drun::rdzv::etcd {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

const Json& emptyObject() {
  static const Json empty = Json::object();
  return empty;
}
const Json& emptyArray() {
  static const Json empty = Json::array();
  return empty;
}

[[noreturn]] void badField(const char* name, const std::string& why) {
  throw ProtocolError(std::string("field '") + name + "' " + why);
}

}  // namespace

std::string base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t n = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t n = uint8_t(bytes[i]) << 16;
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t n = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string base64Decode(std::string_view text, const char* field) {
  if (text.size() % 4 != 0) badField(field, "is not base64 (length " + std::to_string(text.size()) + ")");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    int s[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      const char c = text[i + j];
      if (c == '=' && i + 4 == text.size() && j >= 2) {
        s[j] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (s[j] = sextet(c)) < 0) badField(field, "is not base64");
    }
    const uint32_t n = (s[0] << 18) | (s[1] << 12) | (s[2] << 6) | s[3];
    out += char(n >> 16);
    if (pad < 2) out += char((n >> 8) & 0xff);
    if (pad < 1) out += char(n & 0xff);
  }
  return out;
}

Json parseObject(std::string_view body, const std::string& what) {
  Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object())
    throw ProtocolError(what + ": malformed reply (not a JSON object): " +
                        text::printable(std::string(body.substr(0, 200)), {200}));
  return parsed;
}

int64_t intField(const Json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) badField(name, "is not an integer");
  const std::string& text = it->get_ref<const std::string&>();
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    badField(name, "is not an integer: '" + text::printable(text, {40}) + "'");
  return value;
}

bool boolField(const Json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return false;
  if (!it->is_boolean()) badField(name, "is not a boolean");
  return it->get<bool>();
}

std::string bytesField(const Json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return {};
  if (!it->is_string()) badField(name, "is not a string");
  return base64Decode(it->get_ref<const std::string&>(), name);
}

const Json& objectField(const Json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return emptyObject();
  if (!it->is_object()) badField(name, "is not an object");
  return *it;
}

const Json& arrayField(const Json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return emptyArray();
  if (!it->is_array()) badField(name, "is not an array");
  return *it;
}

EtcdKeyValue parseKeyValue(const Json& kv) {
  if (!kv.is_object()) throw ProtocolError("a key-value entry is not an object");
  EtcdKeyValue out;
  out.key = bytesField(kv, "key");
  out.value = bytesField(kv, "value");
  out.createRevision = intField(kv, "create_revision");
  out.modRevision = intField(kv, "mod_revision");
  out.version = intField(kv, "version");
  out.lease = intField(kv, "lease");
  return out;
}

int64_t headerRevision(const Json& reply) { return intField(objectField(reply, "header"), "revision"); }

EtcdRange parseRange(const Json& reply) {
  EtcdRange out;
  out.revision = headerRevision(reply);
  for (const Json& kv : arrayField(reply, "kvs")) out.kvs.push_back(parseKeyValue(kv));
  out.count = intField(reply, "count");
  return out;
}

std::string errorMessage(const Json& error) {
  auto it = error.find("message");
  if (it != error.end() && it->is_string()) return text::printable(it->get<std::string>(), {300});
  return "no message";
}

}  // namespace drun::rdzv::etcd
