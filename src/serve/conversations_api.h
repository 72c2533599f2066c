// OpenAI's Conversations API (/v1/conversations): a conversation is a list of items kept in the
// front's store (serve/responses_store.h) under its conv_ id; a Responses request that names it
// (`conversation`) reads its items before the input and adds its turn — input and output items —
// when it finishes (responses_api.h, AppendToConversation). This file answers the endpoints
// themselves: create, retrieve, update (metadata), delete; items create, list (paged as
// input_items are), retrieve, delete. Pure functions of the store and the request — the HTTP
// layer and the fuzzer both call them.
#pragma once

#include <cstdint>
#include <string>

#include "serve/openai_api.h"
#include "serve/responses_store.h"

namespace sy::serve {

struct ConversationsReply {
  int status = 200;
  std::string body;  // the JSON answer when status is 200
  ApiError error;    // otherwise
};

// `method` (GET, POST, DELETE), `path` after /v1/conversations ("" or "/{id}[/items[/{item}]]"),
// the URL's query string and the body. `new_id` is a fresh id: the conversation a create makes,
// and (its random part) the batch of items an items create adds; `now` is a create's created_at.
ConversationsReply ConversationsRequest(ResponsesStore& store, const std::string& method,
                                        const std::string& path, const std::string& query,
                                        const std::string& body, const std::string& new_id,
                                        int64_t now);

}  // namespace sy::serve
