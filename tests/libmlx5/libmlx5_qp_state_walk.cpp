// The walk of ibv_modify_qp's cases (tests/emulated_connectx/qp_state_walk.hpp) through Debian's
// libibverbs and libmlx5 on the fake uverbs kernel, which judges each MODIFY_QP by the rules the
// emulated ConnectX applies. Prints one line per case.
#include <cstdio>
#include <string>

#include "tests/emulated_connectx/qp_state_walk.hpp"
#include "tests/libmlx5/fake_device.hpp"

int main() {
    std::string error;
    const rdmachan::libmlx5_instructions::FakeMlx5 mlx5 = rdmachan::libmlx5_instructions::open_fake_mlx5(64, error);
    if (!error.empty()) {
        std::fprintf(stderr, "libmlx5_qp_state_walk: %s\n", error.c_str());
        return 1;
    }
    rdmachan::emulated::walk_modify_cases(mlx5.context, mlx5.pd, mlx5.cq, stdout);
    return 0;
}
