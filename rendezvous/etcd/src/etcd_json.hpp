// Reading and writing the JSON of etcd's gRPC-JSON gateway: keys and values are base64,
// 64-bit integers arrive as strings, false booleans and zero numbers are omitted. Every reader
// takes untrusted input: a value of the wrong shape is a ProtocolError naming the field, never
// a crash. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "drun/etcd/etcd_client.hpp"

namespace drun::rdzv::etcd {

using Json = nlohmann::json;

std::string base64Encode(std::string_view bytes);
// Throws ProtocolError on anything but canonical base64 (padding included).
std::string base64Decode(std::string_view text, const char* field);

// Parses a gateway reply body; ProtocolError ("etcd H:P: malformed reply to PATH: ...") when it
// is not one JSON object.
Json parseObject(std::string_view body, const std::string& what);

// Field readers: an absent field is the protobuf default (0, "", false); a present one of the
// wrong type is a ProtocolError.
int64_t intField(const Json& object, const char* name);
bool boolField(const Json& object, const char* name);
std::string bytesField(const Json& object, const char* name);
const Json& objectField(const Json& object, const char* name);  // absent: an empty object
const Json& arrayField(const Json& object, const char* name);   // absent: an empty array

// The "message" of an error object etcd sent, printable and cut at 300 bytes ("no message").
std::string errorMessage(const Json& error);

EtcdKeyValue parseKeyValue(const Json& kv);
EtcdRange parseRange(const Json& reply);
int64_t headerRevision(const Json& reply);

}  // namespace drun::rdzv::etcd
