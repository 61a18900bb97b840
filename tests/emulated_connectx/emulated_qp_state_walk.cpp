// The walk of ibv_modify_qp's cases (qp_state_walk.hpp) on the emulated ConnectX, linked ahead of
// libibverbs so that its ibv_* functions are the ones called. Prints one line per case.
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cstdio>
#include <cstring>

#include "tests/emulated_connectx/qp_state_walk.hpp"

int main() {
    int count = 0;
    ibv_device** list = ibv_get_device_list(&count);
    if (count != 1 || std::strcmp(ibv_get_device_name(list[0]), "mlx5_0") != 0) {
        std::fprintf(stderr, "emulated_qp_state_walk: the emulated ConnectX is not the one device\n");
        return 1;
    }
    ibv_context* context = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ibv_pd* pd = context != nullptr ? ibv_alloc_pd(context) : nullptr;
    ibv_cq_init_attr_ex cq_attributes{};
    cq_attributes.cqe = 64;
    mlx5dv_cq_init_attr dv{};
    ibv_cq_ex* cq = pd != nullptr ? mlx5dv_create_cq(context, &cq_attributes, &dv) : nullptr;
    if (cq == nullptr) {
        std::fprintf(stderr, "emulated_qp_state_walk: could not open mlx5_0 with a PD and a CQ\n");
        return 1;
    }
    rdmachan::emulated::walk_modify_cases(context, pd, ibv_cq_ex_to_cq(cq), stdout);
    ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
    ibv_dealloc_pd(pd);
    ibv_close_device(context);
    return 0;
}
