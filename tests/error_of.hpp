// What an rdmachan::Error thrown by a call says, or "(no error)": for checks on error messages
// that read as one expression.
#pragma once

#include <functional>
#include <string>

#include "rdmachan/error.hpp"

namespace rdmachan::test {

inline std::string error_of(const std::function<void()>& call) {
    try {
        call();
    } catch (const Error& error) {
        return error.what();
    }
    return "(no error)";
}

}  // namespace rdmachan::test
