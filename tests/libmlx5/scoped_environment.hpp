// An environment variable set for a scope and unset when it ends, also when a failed REQUIRE
// leaves the scope by exception: the next test case must not inherit it (libmlx5 reads
// MLX5_CQE_SIZE whenever a CQ is created).
#pragma once

#include <cstdlib>
#include <string>

namespace rdmachan::libmlx5_instructions {

class ScopedEnvironment {
  public:
    ScopedEnvironment(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
    ~ScopedEnvironment() { unsetenv(name_.c_str()); }
    ScopedEnvironment(const ScopedEnvironment&) = delete;
    ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

  private:
    std::string name_;
};

}  // namespace rdmachan::libmlx5_instructions
