#include "transport/verbs/verbs_error.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace rdmachan::verbs {

namespace {

const char* error_name(int code) {
    switch (code) {
        case EPERM:
            return "EPERM";
        case ENOENT:
            return "ENOENT";
        case EIO:
            return "EIO";
        case EAGAIN:
            return "EAGAIN";
        case ENOMEM:
            return "ENOMEM";
        case EACCES:
            return "EACCES";
        case EFAULT:
            return "EFAULT";
        case EBUSY:
            return "EBUSY";
        case ENODEV:
            return "ENODEV";
        case EINVAL:
            return "EINVAL";
        case ENOSPC:
            return "ENOSPC";
        case ENOSYS:
            return "ENOSYS";
        case ENODATA:
            return "ENODATA";
        case EOPNOTSUPP:
            return "EOPNOTSUPP";
        case ETIMEDOUT:
            return "ETIMEDOUT";
        case EPROTONOSUPPORT:
            return "EPROTONOSUPPORT";
        case ENETUNREACH:
            return "ENETUNREACH";
        case EHOSTUNREACH:
            return "EHOSTUNREACH";
        default:
            return nullptr;
    }
}

}  // namespace

std::string describe_error_code(int code) {
    // strerror_r's GNU variant may return a static string instead of filling the buffer.
    char buffer[128] = {};
    const char* text = strerror_r(code, buffer, sizeof(buffer));
    const char* name = error_name(code);
    if (name == nullptr) return fmt::format("error {} ({})", code, text);
    return fmt::format("{} ({})", name, text);
}

void check_return_code(int return_code, std::string_view call, std::string_view object) {
    if (return_code == 0) return;
    // Some providers return -errno, most return errno: report the magnitude either way.
    const int code = return_code < 0 ? -return_code : return_code;
    throw VerbsError(
        fmt::format("{} failed on {}: returned {}", call, object, describe_error_code(code)), code);
}

void throw_from_errno(std::string_view call, std::string_view object) {
    const int code = errno;
    throw VerbsError(
        fmt::format("{} failed on {}: errno {}", call, object, describe_error_code(code)), code);
}

}  // namespace rdmachan::verbs
