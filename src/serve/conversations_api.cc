#include "serve/conversations_api.h"

#include <fmt/format.h>

#include <algorithm>

#include "serve/responses_api.h"

namespace sy::serve {
namespace {

using json = nlohmann::ordered_json;

constexpr auto& Invalid = InvalidField;
constexpr auto& Get = NonNullField;

ConversationsReply Ok(const json& body) {
  return {200, DumpJson(body), {}};
}

ConversationsReply Error(ApiError error) {
  return {error.status, "", std::move(error)};
}

// The conversation object: id, object, created_at, metadata.
const json& Object(const StoredResponse& stored) {
  return stored.response;
}

// metadata: at most 16 string values (OpenAI's limits: keys of 64 characters, values of 512).
std::optional<ApiError> CheckMetadata(const json& metadata) {
  if (!metadata.is_object()) return Invalid("metadata", "must be an object of strings");
  if (metadata.size() > 16) return Invalid("metadata", "holds at most 16 keys");
  for (const auto& [key, value] : metadata.items()) {
    if (key.size() > 64) return Invalid("metadata", "keys are at most 64 characters");
    if (!value.is_string() || value.get<std::string>().size() > 512)
      return Invalid("metadata." + key, "must be a string of at most 512 characters");
  }
  return std::nullopt;
}

// `items` of a create: 1 to 20 input items (0 allowed when `optional`), read as a Responses
// input would be.
std::optional<ApiError> CheckItems(const json* items, bool optional) {
  if (!items) return optional ? std::nullopt : std::optional(Invalid("items", "is required"));
  if (!items->is_array() || items->size() > 20 || (!optional && items->empty()))
    return Invalid("items", "must be a list of 1 to 20 input items");
  return CheckInputItems(*items, "items");
}

json ParseBody(const std::string& body, std::optional<ApiError>* error) {
  if (body.empty()) return json::object();
  json root = json::parse(body, nullptr, false);
  if (root.is_discarded() || !root.is_object())
    *error = ApiError{400, "the body must be a JSON object", "", "invalid_value"};
  return root;
}

// The items as stored: normalized, each with an id made of the conversation's and `batch`,
// which is new for each request that adds items (ids stay unique when items are deleted).
json StoredItems(const json& items, const std::string& conversation_id, const std::string& batch) {
  return WithItemIds(NormalizedInputItems(items), conversation_id, batch.c_str());
}

ConversationsReply Create(ResponsesStore& store, const std::string& body, const std::string& id,
                          int64_t now) {
  std::optional<ApiError> error;
  const json root = ParseBody(body, &error);
  if (error) return Error(*error);
  if (auto bad = UnknownField(root, "", {"items", "metadata"},
                              "is not a conversation field (items, metadata)"))
    return Error(*bad);
  const json* metadata = Get(root, "metadata");
  if (metadata)
    if (auto bad = CheckMetadata(*metadata)) return Error(*bad);
  const json* items = Get(root, "items");
  if (auto bad = CheckItems(items, true)) return Error(*bad);
  StoredResponse conversation;
  conversation.response = {{"id", id},
                           {"object", "conversation"},
                           {"created_at", now},
                           {"metadata", metadata ? *metadata : json::object()}};
  conversation.context = items ? StoredItems(*items, id, "in") : json::array();
  json answer = conversation.response;
  store.Put(id, std::move(conversation));
  if (!store.Get(id))
    return Error({413, "the conversation is larger than the server's whole store", "items",
                  "request_too_large"});
  return Ok(answer);
}

}  // namespace

ConversationsReply ConversationsRequest(ResponsesStore& store, const std::string& method,
                                        const std::string& path, const std::string& query,
                                        const std::string& body, const std::string& new_id,
                                        int64_t now) {
  try {
    if (path.empty()) {
      if (method != "POST")
        return Error({405, fmt::format("/v1/conversations does not accept {}", method), "",
                      "method_not_allowed"});
      return Create(store, body, new_id, now);
    }
    // "/{id}", "/{id}/items", "/{id}/items/{item}"
    std::string rest = path.substr(1);
    const size_t slash = rest.find('/');
    const std::string id = rest.substr(0, slash);
    rest = slash == std::string::npos ? "" : rest.substr(slash);
    std::string item_id;
    const bool items = rest.starts_with("/items");
    if (items && rest.size() > 6) {
      if (rest[6] != '/' || rest.size() == 7 || rest.find('/', 7) != std::string::npos)
        return Error({404, fmt::format("no such endpoint: /v1/conversations/{}{}", id, rest), "",
                      "not_found"});
      item_id = rest.substr(7);
    } else if (!items && !rest.empty()) {
      return Error({404, fmt::format("no such endpoint: /v1/conversations/{}{}", id, rest), "",
                    "not_found"});
    }
    auto stored = store.Get(id);
    if (id.empty() || !stored || Object(*stored).value("object", "") != "conversation")
      return Error({404, fmt::format("no conversation '{}' (never made, or deleted)", id),
                    "conversation_id", "not_found"});
    std::optional<ApiError> error;
    if (!items) {
      if (method == "GET") return Ok(Object(*stored));
      if (method == "DELETE") {
        store.Erase(id);
        return Ok({{"id", id}, {"object", "conversation.deleted"}, {"deleted", true}});
      }
      if (method != "POST")
        return Error({405, fmt::format("a conversation does not accept {}", method), "",
                      "method_not_allowed"});
      // Update: the metadata, replaced whole.
      const json root = ParseBody(body, &error);
      if (error) return Error(*error);
      if (auto bad = UnknownField(root, "", {"metadata"}, "is not an updatable field (metadata)"))
        return Error(*bad);
      const json* metadata = Get(root, "metadata");
      if (!metadata) return Error(Invalid("metadata", "is required"));
      if (auto bad = CheckMetadata(*metadata)) return Error(*bad);
      json answer;
      store.Update(id, [&](StoredResponse& c) {
        c.response["metadata"] = *metadata;
        answer = c.response;
      });
      return Ok(answer);
    }
    if (item_id.empty()) {
      if (method == "GET") {
        ApiError bad;
        std::string list = InputItemsBody(*stored, query, &bad);
        if (list.empty()) return Error(bad);
        return {200, std::move(list), {}};
      }
      if (method != "POST")
        return Error({405, fmt::format("conversation items do not accept {}", method), "",
                      "method_not_allowed"});
      const json root = ParseBody(body, &error);
      if (error) return Error(*error);
      if (auto bad = UnknownField(root, "", {"items"}, "is not an items field (items)"))
        return Error(*bad);
      const json* added = Get(root, "items");
      if (auto bad = CheckItems(added, false)) return Error(*bad);
      json made;
      store.Update(id, [&](StoredResponse& c) {
        made = StoredItems(*added, id, new_id.substr(new_id.find('_') + 1) + "_");
        for (const json& item : made)
          c.context.push_back(item);
      });
      return Ok({{"object", "list"},
                 {"data", made},
                 {"first_id", made.front()["id"]},
                 {"last_id", made.back()["id"]},
                 {"has_more", false}});
    }
    // One item.
    const json& list = stored->context;
    auto it = std::find_if(list.begin(), list.end(),
                           [&](const json& item) { return item.value("id", "") == item_id; });
    if (it == list.end())
      return Error({404, fmt::format("no item '{}' in conversation '{}'", item_id, id), "item_id",
                    "not_found"});
    if (method == "GET") return Ok(*it);
    if (method != "DELETE")
      return Error({405, fmt::format("a conversation item does not accept {}", method), "",
                    "method_not_allowed"});
    json answer;
    store.Update(id, [&](StoredResponse& c) {
      json kept = json::array();
      for (json& item : c.context)
        if (item.value("id", "") != item_id) kept.push_back(std::move(item));
      c.context = std::move(kept);
      answer = c.response;
    });
    return Ok(answer);
  } catch (const nlohmann::json::exception& e) {
    return Error({400, fmt::format("malformed request: {}", e.what()), "", "invalid_value"});
  }
}

}  // namespace sy::serve
