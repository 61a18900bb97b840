// Control-plane failures of the verbs layer. The message names the call, the value or return
// code and the object, so a person can act on it; code() keeps the errno-style number.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace rdmachan::verbs {

class VerbsError : public std::runtime_error {
  public:
    VerbsError(std::string message, int code)
        : std::runtime_error(std::move(message)), code_(code) {}
    // The errno value the failing call reported (0 when the failure is not from a verbs call).
    int code() const noexcept { return code_; }

  private:
    int code_;
};

// For calls that return their error code directly (ibv_modify_qp, ibv_query_port, ...):
// they do not set errno, so the return value is the only truth.
void check_return_code(int return_code, std::string_view call, std::string_view object);

// For calls that return NULL and set errno (ibv_open_device, ibv_reg_mr, ibv_create_qp, ...).
[[noreturn]] void throw_from_errno(std::string_view call, std::string_view object);

// "ENOMEM (Cannot allocate memory)": the symbolic name is what people search for.
std::string describe_error_code(int code);

}  // namespace rdmachan::verbs
