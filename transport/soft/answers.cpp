// The responder's answers (answers.hpp): sent in order, plain write ACKs coalesced within a read
// turn.
#include "transport/soft/answers.hpp"

#include <algorithm>

#include "transport/soft/connection.hpp"
#include "transport/soft/device.hpp"
#include "transport/soft/gid.hpp"
#include "transport/soft/device_statistics.hpp"
#include "transport/soft/peer_links.hpp"

namespace rdmachan::soft {

void Answers::respond(Connection& connection, const wire::Response& response, const void* payload,
                      std::uint32_t payload_length) {
    send_held(connection);  // answers leave in the order of their requests
    // What the request wrote into this process's memory is released before the answer leaves:
    // the initiator may learn of the write from it and tell this process out of band.
    note_remote_access();
    std::vector<std::uint8_t> frame = wire::frame(wire::FrameType::response, response, payload, payload_length);
    if (connection.socket < 0 && same_gid(connection.gid, gid_) && connection.lid == lid_) {
        loopback_.push_back(std::move(frame));
        return;
    }
    links_.queue_output(connection, frame);
}

void Answers::respond_coalescing(Connection& connection, const wire::Response& response) {
    if (turn_ != &connection || connection.socket < 0 || !connection.accepts_coalesced_acknowledgements) {
        respond(connection, response);
        return;
    }
    if (connection.holds_acknowledgement && connection.held_acknowledgement.destination_qpn != response.destination_qpn) {
        send_held(connection);
    }
    note_remote_access();  // as respond: released before anything can learn of the write
    if (connection.holds_acknowledgement) DeviceStatistics::count_one(statistics_.coalesced_acknowledgements);
    connection.held_acknowledgement = response;
    connection.holds_acknowledgement = true;
}

void Answers::end_turn(Connection& connection) {
    turn_ = nullptr;
    if (!deferring_ || !connection.holds_acknowledgement || connection.socket < 0) {
        send_held(connection);
        return;
    }
    if (std::find(deferred_.begin(), deferred_.end(), &connection) == deferred_.end()) deferred_.push_back(&connection);
}

void Answers::send_deferred() {
    for (Connection* connection : deferred_) send_held(*connection);
    deferred_.clear();
}

void Answers::forget_closed() {
    std::erase_if(deferred_, [](const Connection* connection) { return connection->socket < 0; });
}

void Answers::send_held(Connection& connection) {
    if (!connection.holds_acknowledgement) return;
    connection.holds_acknowledgement = false;
    respond(connection, connection.held_acknowledgement);
}

}  // namespace rdmachan::soft
