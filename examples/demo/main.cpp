#include <cstdio>

#include "rdmachan/version.hpp"

int main() {
    std::printf("rdmachan %s\n", rdmachan::version());
    return 0;
}
