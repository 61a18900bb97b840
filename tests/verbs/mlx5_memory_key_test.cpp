// The indirect memory key binding without hardware: its refusals name what was wrong, and the
// verbs path's refusal of memory layouts names the device.
#include <doctest/doctest.h>

#include <cerrno>
#include <string>

#include "transport/verbs/mlx5_memory_key.hpp"
#include "transport/verbs/verbs_error.hpp"

using rdmachan::verbs::Mlx5IndirectKey;
using rdmachan::verbs::VerbsError;

TEST_CASE("mlx5dv_create_mkey arguments are checked before the device is asked") {
    CHECK_THROWS_WITH_AS(Mlx5IndirectKey::create(nullptr, 4), doctest::Contains("no protection domain"), VerbsError);
}

TEST_CASE("the verbs path says memory layouts are not available, naming the device") {
    try {
        rdmachan::verbs::throw_layouts_unavailable("rxe0");
        FAIL("no exception");
    } catch (const VerbsError& error) {
        CHECK(std::string(error.what()).find("not available on device rxe0") != std::string::npos);
        CHECK(error.code() == EOPNOTSUPP);
    }
}
