// The host side of the nvcc build of the data path (the __host__ __device__ functions compiled
// by nvcc's front end, then its host compiler): runs the host cases (host_cases.hpp) and writes
// their bytes to the file named, for comparison with the g++ build's.
#include "tests/cuda/host_cases.hpp"

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    std::FILE* out = std::fopen(argv[1], "wb");
    if (out == nullptr) return 2;
    host_cases::run(out);
    return std::fclose(out) == 0 ? 0 : 1;
}
