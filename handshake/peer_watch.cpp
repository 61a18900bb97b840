// The TCP rendezvous as a PeerWatch: its events and acknowledgements go over the connection the
// rank kept after the barrier (README.md here, "Peer replacement").
#include "handshake/peer_watch.hpp"

#include "rdmachan/error.hpp"

namespace rdmachan::detail {
namespace {

class RendezvousWatch final : public PeerWatch {
  public:
    explicit RendezvousWatch(std::shared_ptr<Rendezvous> rendezvous) : rendezvous_(std::move(rendezvous)) {}
    std::vector<RendezvousEvent> poll_events() override { return rendezvous_->poll_events(); }
    void acknowledge_replacement(std::uint32_t peer, std::uint64_t session, const std::optional<RcEntry>& entry) override {
        rendezvous_->acknowledge_replacement(peer, session, entry);
    }
    std::string spawn_replacement(std::uint32_t peer, const std::vector<std::string>&) override {
        throw Error("spawn_replacement (rank " + std::to_string(peer) +
                    "): under the TCP rendezvous the application starts the replacement itself, with "
                    "RendezvousSettings::replacement = PeerReplacement::replace_failed_rank");
    }

  private:
    std::shared_ptr<Rendezvous> rendezvous_;
};

}  // namespace

std::shared_ptr<PeerWatch> watch_through_rendezvous(std::shared_ptr<Rendezvous> rendezvous) {
    return std::make_shared<RendezvousWatch>(std::move(rendezvous));
}

}  // namespace rdmachan::detail
