// The PMIx bootstrap in a build without libpmix-dev: every entry point says so.
#include "handshake/pmix_bootstrap.hpp"
#include "rdmachan/error.hpp"

namespace rdmachan::detail {

struct PmixSession::State {};

namespace {
[[noreturn]] void unavailable() {
    throw Error("the PMIx bootstrap is unavailable: rdmachan was built without PMIx; install Debian's libpmix-dev "
                "and rebuild, or use the TCP rendezvous (RDMACHAN_BOOTSTRAP=tcp)");
}
}  // namespace

std::shared_ptr<PmixSession> PmixSession::open(Clock::time_point) { unavailable(); }
PmixSession::PmixSession(std::unique_ptr<State> state) : state_(std::move(state)) {}
PmixSession::~PmixSession() = default;
std::uint32_t PmixSession::rank() const { unavailable(); }
std::uint32_t PmixSession::world_size() const { unavailable(); }
const std::string& PmixSession::job() const { unavailable(); }
std::vector<Endpoint> PmixSession::exchange(const Endpoint&, Clock::time_point) { unavailable(); }
void PmixSession::barrier(Clock::time_point) { unavailable(); }
std::uint64_t PmixSession::last_exchange_bytes() const { unavailable(); }
const PmixSession::ExchangePhases& PmixSession::last_exchange_phases() const { unavailable(); }
std::uint64_t PmixSession::take_exchange_sequence() { unavailable(); }
std::uint64_t PmixSession::last_exchange_sequence() const { unavailable(); }
void PmixSession::publish(const std::string&, const std::string&) { unavailable(); }
std::vector<std::optional<std::string>> PmixSession::lookup(const std::vector<std::string>&) { unavailable(); }
std::string PmixSession::get(const std::string&, std::uint32_t, const std::string&, Clock::time_point) { unavailable(); }
std::uint32_t PmixSession::job_size(const std::string&, Clock::time_point) { unavailable(); }
std::string PmixSession::spawn(const std::vector<std::string>&, const std::vector<std::string>&) { unavailable(); }
void PmixSession::set_replaces(Replaces) { unavailable(); }
PmixSession::ProcessState PmixSession::process_state(const std::string&, std::uint32_t) { unavailable(); }
const std::optional<PmixSession::Replaces>& PmixSession::replaces() const { unavailable(); }

}  // namespace rdmachan::detail
