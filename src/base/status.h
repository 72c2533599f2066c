// Errors as values: every edge (files, configs, requests) returns a Status or a Result<T> whose
// message names the file, tensor, field or request at fault. Hot loops never see these.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace sy {

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }
  template <typename... Args>
  static Status Errorf(fmt::format_string<Args...> format, Args&&... args) {
    return Status(fmt::format(format, std::forward<Args>(args)...));
  }

  bool ok() const { return !message_.has_value(); }
  explicit operator bool() const { return ok(); }
  const std::string& message() const {
    static const std::string kEmpty;
    return message_ ? *message_ : kEmpty;
  }
  // Prefixes context ("loading model DIR: ") onto an error; an ok status stays ok.
  Status WithContext(const std::string& context) const {
    return ok() ? *this : Status(context + ": " + *message_);
  }

 private:
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : value_(std::move(status)) {}  // NOLINT: must be an error

  bool ok() const { return std::holds_alternative<T>(value_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(value_);
  }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace sy

// Returns early from the enclosing function when a Status is an error.
#define SY_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::sy::Status sy_status_ = (expr);        \
    if (!sy_status_.ok()) return sy_status_; \
  } while (0)

#define SY_CONCAT_INNER(a, b) a##b
#define SY_CONCAT(a, b) SY_CONCAT_INNER(a, b)
// Binds `lhs` to the value of a Result, or returns its error.
#define SY_ASSIGN_OR_RETURN(lhs, expr)                                                        \
  auto SY_CONCAT(sy_result_, __LINE__) = (expr);                                              \
  if (!SY_CONCAT(sy_result_, __LINE__).ok()) return SY_CONCAT(sy_result_, __LINE__).status(); \
  lhs = std::move(SY_CONCAT(sy_result_, __LINE__)).value()
