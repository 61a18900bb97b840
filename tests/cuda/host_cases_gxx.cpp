// The g++ build of the host cases (host_cases.hpp): writes their bytes to the file named.
#include "tests/cuda/host_cases.hpp"

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    std::FILE* out = std::fopen(argv[1], "wb");
    if (out == nullptr) return 2;
    host_cases::run(out);
    return std::fclose(out) == 0 ? 0 : 1;
}
