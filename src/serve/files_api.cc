#include "serve/files_api.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include <fmt/format.h>

#include "base/partial_file.h"
#include "tokenizer/tokenizer.h"  // ReadTextFile

namespace sy::serve {

using json = nlohmann::ordered_json;

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// A header value's parameters: `; key=value` or `; key="quoted \" value"`, keys lower-cased.
// The value before the first ';' is returned as "".
Result<std::map<std::string, std::string>> HeaderParameters(std::string_view value) {
  std::map<std::string, std::string> out;
  size_t at = value.find(';');
  out[""] = std::string(Trim(value.substr(0, at)));
  while (at != std::string_view::npos) {
    ++at;
    while (at < value.size() && (value[at] == ' ' || value[at] == '\t'))
      ++at;
    const size_t eq = value.find('=', at);
    if (eq == std::string_view::npos) {
      if (Trim(value.substr(at)).empty()) break;
      return Status::Errorf("a parameter without a value: \"{}\"", value.substr(at));
    }
    std::string key(Trim(value.substr(at, eq - at)));
    std::transform(key.begin(), key.end(), key.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    at = eq + 1;
    std::string parsed;
    if (at < value.size() && value[at] == '"') {
      ++at;
      bool closed = false;
      while (at < value.size()) {
        const char c = value[at++];
        if (c == '\\' && at < value.size()) {
          parsed += value[at++];
        } else if (c == '"') {
          closed = true;
          break;
        } else {
          parsed += c;
        }
      }
      if (!closed) return Status::Errorf("parameter {}: an unclosed quoted string", key);
      at = value.find(';', at);
    } else {
      const size_t end = value.find(';', at);
      parsed = std::string(Trim(value.substr(at, end == std::string_view::npos ? end : end - at)));
      at = end;
    }
    out[key] = std::move(parsed);
  }
  return out;
}

}  // namespace

std::string RandomObjectId(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

std::string QueryParameter(const std::string& query, const std::string& key) {
  // Query parameters here are ids, purposes and integers: no percent-decoding needed.
  for (size_t at = 0; at <= query.size();) {
    const size_t end = std::min(query.find('&', at), query.size());
    const std::string_view pair(query.data() + at, end - at);
    if (pair.starts_with(key + "=")) return std::string(pair.substr(key.size() + 1));
    at = end + 1;
  }
  return "";
}

ApiReply ErrorReply(int status, std::string message, std::string param, std::string code) {
  ApiReply reply;
  reply.error = {status, std::move(message), std::move(param), std::move(code)};
  return reply;
}

ApiReply JsonReply(const json& body) {
  ApiReply reply;
  reply.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return reply;
}

std::optional<int64_t> LimitParameter(const std::string& query, int64_t most) {
  const std::string given = QueryParameter(query, "limit");
  if (given.empty()) return 20;
  int64_t limit = -1;
  try {
    size_t used = 0;
    limit = std::stoll(given, &used);
    if (used != given.size()) return std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
  if (limit < 1 || limit > most) return std::nullopt;
  return limit;
}

ApiReply ListPage(const std::vector<json>& objects, const std::string& query) {
  const std::optional<int64_t> limit = LimitParameter(query, 10000);
  if (!limit)
    return ErrorReply(400, "limit must be an integer in [1, 10000]", "limit", "invalid_value");
  const std::string after = QueryParameter(query, "after");
  size_t from = 0;
  if (!after.empty()) {
    auto it = std::find_if(objects.begin(), objects.end(),
                           [&](const json& object) { return object["id"] == after; });
    if (it == objects.end())
      return ErrorReply(400, fmt::format("after: no object '{}'", after), "after", "invalid_value");
    from = static_cast<size_t>(it - objects.begin()) + 1;
  }
  json data = json::array();
  for (size_t i = from; i < objects.size() && static_cast<int64_t>(data.size()) < *limit; ++i)
    data.push_back(objects[i]);
  json page = {{"object", "list"}, {"data", data}};
  page["first_id"] = data.empty() ? json(nullptr) : data.front()["id"];
  page["last_id"] = data.empty() ? json(nullptr) : data.back()["id"];
  page["has_more"] = from + data.size() < objects.size();
  return JsonReply(page);
}

Result<std::vector<FormPart>> ParseMultipart(std::string_view content_type, std::string_view body) {
  SY_ASSIGN_OR_RETURN(auto type, HeaderParameters(content_type));
  if (!IEquals(type[""], "multipart/form-data"))
    return Status::Errorf("the body must be multipart/form-data, not \"{}\"", type[""]);
  const std::string boundary = type["boundary"];
  if (boundary.empty() || boundary.size() > 200)
    return Status::Error("multipart/form-data without a boundary (of 1 to 200 characters)");
  const std::string delimiter = "--" + boundary;
  std::vector<FormPart> parts;
  // The first delimiter may follow a preamble; every later one follows a CRLF.
  size_t at = body.starts_with(delimiter) ? 0 : body.find("\r\n" + delimiter);
  if (at == std::string_view::npos) return Status::Error("multipart: no boundary line");
  at += body.starts_with(delimiter) ? delimiter.size() : delimiter.size() + 2;
  while (true) {
    if (body.substr(at, 2) == "--") return parts;  // the closing delimiter
    // Transport padding after a delimiter, then its CRLF.
    while (at < body.size() && (body[at] == ' ' || body[at] == '\t'))
      ++at;
    if (body.substr(at, 2) != "\r\n")
      return Status::Error("multipart: a boundary line not ended by CRLF");
    at += 2;
    const size_t headers_end = body.find("\r\n\r\n", at);
    if (headers_end == std::string_view::npos && body.substr(at, 2) != "\r\n")
      return Status::Errorf("multipart: part {} has no end of headers", parts.size() + 1);
    FormPart part;
    bool disposition = false;
    const size_t data_begin = headers_end == std::string_view::npos ? at + 2 : headers_end + 4;
    for (size_t line = at; headers_end != std::string_view::npos && line < headers_end;) {
      const size_t end = std::min(body.find("\r\n", line), headers_end);
      const std::string_view header = body.substr(line, end - line);
      line = end + 2;
      const size_t colon = header.find(':');
      if (colon == std::string_view::npos)
        return Status::Errorf("multipart: part {}: a header without ':'", parts.size() + 1);
      const std::string_view name = Trim(header.substr(0, colon));
      const std::string_view value = Trim(header.substr(colon + 1));
      if (IEquals(name, "content-disposition")) {
        SY_ASSIGN_OR_RETURN(auto params, HeaderParameters(value));
        if (!IEquals(params[""], "form-data"))
          return Status::Errorf("multipart: part {} is not form-data", parts.size() + 1);
        part.name = params["name"];
        part.filename = params["filename"];
        disposition = true;
      } else if (IEquals(name, "content-type")) {
        part.content_type = std::string(value);
      }
    }
    if (!disposition || part.name.empty())
      return Status::Errorf("multipart: part {} has no Content-Disposition name", parts.size() + 1);
    const size_t data_end = body.find("\r\n" + delimiter, data_begin);
    if (data_end == std::string_view::npos)
      return Status::Errorf("multipart: part {} (\"{}\") is not closed by the boundary",
                            parts.size() + 1, part.name);
    part.data = std::string(body.substr(data_begin, data_end - data_begin));
    parts.push_back(std::move(part));
    at = data_end + 2 + delimiter.size();
    if (parts.size() > 64) return Status::Error("multipart: more than 64 parts");
  }
}

json FileObject(const StoredFile& file) {
  return {{"id", file.id},
          {"object", "file"},
          {"bytes", file.content.size()},
          {"created_at", file.created_at},
          {"filename", file.filename},
          {"purpose", file.purpose},
          {"status", "processed"},
          {"expires_at", nullptr},
          {"status_details", nullptr}};
}

bool HiddenFromFilesApi(const StoredFile& file) {
  return file.purpose == kMessageBatchRequestsPurpose ||
         file.purpose == kMessageBatchResultsPurpose;
}

namespace {

// A file's description on disk, beside its content.
json FileRecord(const StoredFile& file) {
  return {{"id", file.id},
          {"filename", file.filename},
          {"purpose", file.purpose},
          {"created_at", file.created_at},
          {"bytes", file.content.size()}};
}

Status WriteWhole(const std::string& path, const std::string& bytes) {
  SY_ASSIGN_OR_RETURN(PartialFile out, PartialFile::Create(path));
  SY_RETURN_IF_ERROR(out.Put(bytes.data(), bytes.size()));
  return out.Commit(/*durable=*/true);
}

}  // namespace

Result<std::unique_ptr<FileStore>> FileStore::Open(size_t budget_bytes,
                                                   const std::string& directory) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(fs::path(directory) / "files", ec);
  if (!ec) fs::create_directories(fs::path(directory) / "batches", ec);
  if (ec) return Status::Errorf("--files-dir {}: cannot create it ({})", directory, ec.message());
  std::unique_ptr<FileStore> store(new FileStore(budget_bytes));
  store->directory_ = directory;
  const std::string lock_path = directory + "/lock";
  store->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (store->lock_fd_ < 0)
    return Status::Errorf("--files-dir {}: cannot open {} ({})", directory, lock_path,
                          std::strerror(errno));
  if (::flock(store->lock_fd_, LOCK_EX | LOCK_NB) != 0)
    return Status::Errorf("--files-dir {}: another process keeps its files there (one at a time)",
                          directory);
  SY_RETURN_IF_ERROR(store->Load());
  return store;
}

FileStore::~FileStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // the lock goes with it
}

std::string FileStore::batches_directory() const {
  return directory_.empty() ? "" : directory_ + "/batches";
}

std::string FileStore::FilePath(const std::string& id, const char* suffix) const {
  return directory_ + "/files/" + id + suffix;
}

Status FileStore::Load() {
  namespace fs = std::filesystem;
  std::vector<std::shared_ptr<StoredFile>> loaded;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_ + "/files", ec)) {
    const fs::path path = entry.path();
    if (path.extension() != ".json") continue;  // contents, and .partial files a crash left
    SY_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path.string()));
    const json record = json::parse(text, nullptr, false);
    if (!record.is_object())
      return Status::Errorf("{}: not a file description (a JSON object)", path.string());
    auto file = std::make_shared<StoredFile>();
    try {
      file->id = record.at("id").get<std::string>();
      file->filename = record.at("filename").get<std::string>();
      file->purpose = record.at("purpose").get<std::string>();
      file->created_at = record.at("created_at").get<int64_t>();
      const auto bytes = record.at("bytes").get<uint64_t>();
      if (path.stem().string() != file->id)
        return Status::Errorf("{}: describes file '{}'", path.string(), file->id);
      SY_ASSIGN_OR_RETURN(file->content, ReadTextFile(FilePath(file->id, ".content")));
      if (file->content.size() != bytes)
        return Status::Errorf("{}: its content holds {} bytes where it says {}", path.string(),
                              file->content.size(), bytes);
    } catch (const json::exception& e) {
      return Status::Errorf("{}: not a file description ({})", path.string(), e.what());
    }
    used_ += file->content.size();
    loaded.push_back(std::move(file));
  }
  if (ec) return Status::Errorf("--files-dir {}: cannot list it ({})", directory_, ec.message());
  if (used_ > budget_)
    return Status::Errorf(
        "--files-dir {}: its files hold {} bytes, more than --files-mb allows ({} bytes)",
        directory_, used_, budget_);
  std::sort(loaded.begin(), loaded.end(), [](const auto& a, const auto& b) {
    return a->created_at != b->created_at ? a->created_at < b->created_at : a->id < b->id;
  });
  files_.assign(loaded.begin(), loaded.end());
  return Status::Ok();
}

Result<std::shared_ptr<const StoredFile>> FileStore::Add(std::string filename, std::string purpose,
                                                         std::string content, int64_t now) {
  auto file = std::make_shared<StoredFile>();
  file->id = RandomObjectId("file-");
  file->filename = std::move(filename);
  file->purpose = std::move(purpose);
  file->created_at = now;
  file->content = std::move(content);
  std::lock_guard lock(mutex_);
  if (used_ + file->content.size() > budget_)
    return Status::Errorf(
        "the file ({} bytes) does not fit: {} of the server's {} bytes for files are taken "
        "(serve --files-mb; delete files that are no longer needed)",
        file->content.size(), used_, budget_);
  if (!directory_.empty()) {
    // The content first: a description on disk always has its content.
    Status written = WriteWhole(FilePath(file->id, ".content"), file->content);
    if (written.ok()) written = WriteWhole(FilePath(file->id, ".json"), FileRecord(*file).dump());
    if (!written.ok()) {
      std::remove(FilePath(file->id, ".content").c_str());
      return Status::Errorf("the file could not be kept: {}", written.message());
    }
  }
  used_ += file->content.size();
  files_.push_back(file);
  return std::shared_ptr<const StoredFile>(file);
}

std::shared_ptr<const StoredFile> FileStore::Get(const std::string& id) const {
  std::lock_guard lock(mutex_);
  for (const auto& file : files_)
    if (file->id == id) return file;
  return nullptr;
}

bool FileStore::Remove(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(files_.begin(), files_.end(), [&](const auto& f) { return f->id == id; });
  if (it == files_.end()) return false;
  used_ -= (*it)->content.size();
  if (!directory_.empty()) {  // the description first: a content alone is not read back
    std::remove(FilePath((*it)->id, ".json").c_str());
    std::remove(FilePath((*it)->id, ".content").c_str());
  }
  files_.erase(it);
  return true;
}

std::vector<std::shared_ptr<const StoredFile>> FileStore::List(const std::string& purpose) const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<const StoredFile>> out;
  for (auto it = files_.rbegin(); it != files_.rend(); ++it)
    if (purpose.empty() || (*it)->purpose == purpose) out.push_back(*it);
  return out;
}

ApiReply FilesRequest(FileStore& files, const std::string& method, const std::string& path,
                      const std::string& query, std::string_view content_type,
                      std::string_view body, int64_t now) {
  if (path.empty() || path == "/") {
    if (method == "GET") {
      std::vector<json> objects;
      for (const auto& file : files.List(QueryParameter(query, "purpose")))
        if (!HiddenFromFilesApi(*file)) objects.push_back(FileObject(*file));
      return ListPage(objects, query);
    }
    if (method != "POST")
      return ErrorReply(405, "use GET or POST on /v1/files", "", "invalid_method");
    auto parts = ParseMultipart(content_type, body);
    if (!parts.ok()) return ErrorReply(400, parts.status().message(), "file", "invalid_value");
    FormPart* file = nullptr;
    std::string purpose;
    for (FormPart& part : *parts) {
      if (part.name == "file") file = &part;
      if (part.name == "purpose") purpose = part.data;
    }
    if (!file) return ErrorReply(400, "no \"file\" part", "file", "invalid_value");
    if (purpose.empty()) return ErrorReply(400, "no \"purpose\" part", "purpose", "invalid_value");
    // Only batch input has a use here; other purposes are the hosted platform's.
    if (purpose != "batch")
      return ErrorReply(
          400,
          fmt::format("purpose \"{}\" is not supported (only \"batch\": this server runs "
                      "batches, nothing else reads files)",
                      purpose),
          "purpose", "invalid_value");
    // The part's bytes move into the store: an upload is held twice (the request and the file)
    // rather than three times.
    auto stored = files.Add(file->filename.empty() ? "upload" : file->filename, purpose,
                            std::move(file->data), now);
    if (!stored.ok()) return ErrorReply(413, stored.status().message(), "file", "file_too_large");
    return JsonReply(FileObject(**stored));
  }
  // /{id} or /{id}/content
  std::string id = path.substr(1);
  const bool content = id.ends_with("/content");
  if (content) id.resize(id.size() - std::string_view("/content").size());
  auto file = files.Get(id);
  if (!file || HiddenFromFilesApi(*file))
    return ErrorReply(404, fmt::format("no file '{}'", id), "file_id", "not_found");
  if (content) {
    if (method != "GET")
      return ErrorReply(405, "use GET on a file's content", "", "invalid_method");
    ApiReply reply;
    reply.body = file->content;
    reply.content_type = "application/octet-stream";
    return reply;
  }
  if (method == "GET") return JsonReply(FileObject(*file));
  if (method == "DELETE") {
    files.Remove(id);
    return JsonReply(json{{"id", id}, {"object", "file"}, {"deleted", true}});
  }
  return ErrorReply(405, "use GET or DELETE on a file", "", "invalid_method");
}

}  // namespace sy::serve
