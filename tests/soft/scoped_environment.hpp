// Test fixture: an environment variable set for one scope. The software device reads its
// settings (RDMACHAN_SOFT_TRANSPORT, RDMACHAN_SOFT_ZERO_HOP, ...) when it opens, so a test sets
// them around the open and leaves the process's environment as it found it.
#pragma once

#include <cstdlib>
#include <string>

namespace rdmachan::test {

class Environment {
public:
    Environment(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name); old != nullptr) {
            had_value_ = true;
            old_ = old;
        }
        ::setenv(name, value, 1);
    }
    ~Environment() {
        if (had_value_) {
            ::setenv(name_, old_.c_str(), 1);
        } else {
            ::unsetenv(name_);
        }
    }
    Environment(const Environment&) = delete;
    Environment& operator=(const Environment&) = delete;

private:
    const char* name_;
    bool had_value_ = false;  // an empty value is a value: it is put back, not removed
    std::string old_;
};

}  // namespace rdmachan::test
