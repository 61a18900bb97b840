// mlx5-golden-capture: writes capture-shaped receive and completion cases (the schema of the
// golden README's recv-vectors) made by the installed libmlx5 on the fake uverbs device of
// tests/libmlx5, for the prior states the shipped vectors do not show: receive queues and SRQs
// brought to their state by a list of steps, completions emulated before the setup's receives,
// CQEs pre-polled with no receive outstanding, receives on a second QP.
//
//   mlx5-golden-capture OUTPUT.json
//
// Every case runs twice, the memory a capture call may write poisoned with a different byte
// each time: a byte counts as written where either run left something other than its poison.
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <vector>

#include "tests/libmlx5/fake_uverbs.hpp"
#include "tools/golden_check/capture/capture_memory.hpp"
#include "tools/golden_check/capture/libmlx5_queues.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace {

namespace mlx5 = rdmachan::mlx5;
using namespace rdmachan::golden::capture;
using nlohmann::json;

constexpr std::uint8_t kPoisons[2] = {0xa5, 0x5a};

CqeSpec responder(const QueuePair& qp, std::uint8_t opcode, std::uint16_t wqe_counter,
                  std::uint32_t immediate = 0) {
    CqeSpec cqe;
    cqe.opcode = opcode;
    cqe.user_index = qp.user_index;
    cqe.sop_drop_qpn = qp.qp->qp_num;
    cqe.wqe_counter = wqe_counter;
    cqe.immediate = immediate;
    return cqe;
}

// The requester CQE of the SEND that starts at WQEBB `wqe_counter`.
CqeSpec requester_send(const QueuePair& qp, std::uint16_t wqe_counter) {
    CqeSpec cqe;
    cqe.opcode = mlx5::kCqeRequester;
    cqe.user_index = qp.user_index;
    cqe.sop_drop_qpn = static_cast<std::uint32_t>(mlx5::kOpcodeSend) << 24 | qp.qp->qp_num;
    cqe.wqe_counter = wqe_counter;
    cqe.byte_count = 0;
    return cqe;
}

std::vector<CqeSpec> responder_sends(const QueuePair& qp, std::uint32_t first_counter,
                                     std::uint32_t count) {
    std::vector<CqeSpec> cqes;
    for (std::uint32_t i = 0; i < count; ++i)
        cqes.push_back(responder(qp, mlx5::kCqeResponderSend, first_counter + i));
    return cqes;
}

std::uint32_t record_value(const volatile std::uint32_t* record, int word) {
    return mlx5::big_to_host32(record[word]);
}

json rq_state(const ReceiveCounters& counters) {
    return {{"head", counters.head()}, {"tail", counters.tail()}};
}

json recv_inputs(const QueuePair& qp, std::uint32_t head, std::uint32_t tail) {
    json rq_before = receive_queue_geometry(qp);
    rq_before["head"] = head;
    rq_before["tail"] = tail;
    return {{"rq_before", rq_before},
            {"qp_create_attr",
             {{"max_recv_wr", 8},
              {"max_recv_sge", 4},
              {"qp_state", "RTS"},
              {"MLX5_QP_SIGNATURE", "unset"}}}};
}

// The capture of a recv_wqe case: `list` posted to `qp`, whose receive ring and doorbell record
// were poisoned first; then every receive outstanding completed, to read libmlx5's wr_id array.
json capture_receive_post(Libmlx5Queues& queues, QueuePair& qp, ReceiveCounters& counters,
                          const std::vector<ReceiveSpec>& list, std::uint8_t poison) {
    auto* ring = static_cast<std::uint8_t*>(qp.dv.rq.buf);
    const std::size_t ring_bytes = static_cast<std::size_t>(qp.dv.rq.wqe_cnt) * qp.dv.rq.stride;
    std::memset(ring, poison, ring_bytes);
    std::memset(const_cast<std::uint32_t*>(qp.dv.dbrec), poison, 8);
    const std::uint32_t head_before = counters.head();
    const std::uint32_t tail_before = counters.tail();
    json step = queues.post_receives(qp, list);
    json outputs = {{"return_code", step.at("return_code")},
                    {"return_code_name", std::to_string(step.at("return_code").get<int>())},
                    {"bad_wr_index", step.at("bad_wr_index")},
                    {"rq_head_before", head_before},
                    {"rq_head_after", counters.head()},
                    {"rq_tail_before", tail_before},
                    {"rq_tail_after", counters.tail()},
                    {"wqes", json::array()}};
    for (std::uint32_t counter = head_before; counter != counters.head(); ++counter) {
        const std::uint32_t slot = counter & (qp.dv.rq.wqe_cnt - 1);
        json wqe = written_region(ring + static_cast<std::size_t>(slot) * qp.dv.rq.stride,
                                  qp.dv.rq.stride, poison);
        wqe["wr_index"] = counter - head_before;
        wqe["rq_counter"] = counter;
        wqe["ring_index"] = slot;
        wqe["byte_offset_in_rq"] = slot * qp.dv.rq.stride;
        outputs["wqes"].push_back(wqe);
    }
    json dbrec = written_region(const_cast<std::uint32_t*>(qp.dv.dbrec), 8, poison);
    dbrec["rcv_dbr_value"] = record_value(qp.dv.dbrec, 0);
    dbrec["snd_dbr_written"] = false;
    outputs["dbrec"] = dbrec;
    // libmlx5 v44 hands out wrid[tail] per responder CQE: polling them all reads the array.
    json wr_ids = json::array();
    for (std::uint32_t i = 0; i < qp.dv.rq.wqe_cnt; ++i) wr_ids.push_back(nullptr);
    std::vector<ibv_wc> wc;
    const std::uint32_t outstanding = counters.head() - counters.tail();
    const std::uint32_t first = counters.tail();
    queues.write_and_poll(responder_sends(qp, first, outstanding), outstanding, poison, wc);
    for (std::uint32_t i = 0; i < wc.size(); ++i)
        wr_ids[(first + i) & (qp.dv.rq.wqe_cnt - 1)] = hex_number(wc[i].wr_id);
    outputs["wrid_array_after"] = wr_ids;
    return outputs;
}

json recv_case(const char* name, const char* description) {
    return {{"name", name},
            {"kind", "recv_wqe"},
            {"api", "ibv_post_recv"},
            {"description", description}};
}

// Receives in three calls, four of them completed by polled RESP_SEND CQEs and two more by
// emulation (rq.tail = rq.head, as the golden harness completes them), a send and its
// completion between them (the QP's send doorbell record holds 1), then a chain that wraps the
// ring.
json rq_steps_wrap_after_polls(std::uint8_t poison) {
    Libmlx5Queues queues(63);
    QueuePair& qp = queues.add_queue_pair(8, 4);
    json steps = json::array();
    std::vector<ibv_wc> wc;
    steps.push_back(queues.post_receives(qp, {{0x2000, 1}, {0x2001, 2}, {0x2002, 1}}));
    steps.push_back(queues.post_receives(qp, {{0x2003, 3}, {0x2004, 1}, {0x2005, 0}}));
    steps.push_back(queues.write_and_poll(responder_sends(qp, 0, 4), 4, poison, wc));
    steps.push_back(queues.post_send(qp, 0x3000));
    steps.push_back(queues.write_and_poll({requester_send(qp, 0)}, 1, poison, wc));
    ReceiveCounters(qp.qp, qp.dv.rq.wqe_cnt, 6, 6, 4).set_tail(6);
    steps.push_back({{"op", "emulate_rq_completions"}});
    steps.push_back(queues.post_receives(qp, {{0x2006, 1}, {0x2007, 2}}));
    ReceiveCounters counters(qp.qp, qp.dv.rq.wqe_cnt, 6, 8, 6);
    json one_case = recv_case(
        "rq_steps_wrap_after_polls",
        "RC QP (max_recv_wr 8, max_recv_sge 4): 8 receives in three calls, 4 completed by polled "
        "RESP_SEND CQEs and 2 by emulation, a signaled SEND and its completion between them; then "
        "a 3-WR chain that wraps the ring");
    json inputs = recv_inputs(qp, counters.head(), counters.tail());
    inputs["before_capture"] = steps;
    const std::vector<ReceiveSpec> list = {{0x4000, 2}, {0x4001, 1}, {0x4002, 4}};
    inputs["wr_list"] = json::array();
    for (const ReceiveSpec& spec : list) inputs["wr_list"].push_back(receive_json(spec));
    one_case["inputs"] = inputs;
    one_case["outputs"] = capture_receive_post(queues, qp, counters, list, poison);
    return one_case;
}

// Twelve fillers, two per call, completions emulated (rq.tail = rq.head) after the fourth call
// (the fifth would not fit without) and the fifth, as the golden harness emulates them; the
// text form of before_capture.
json rq_fillers_completed_between_calls(std::uint8_t poison) {
    Libmlx5Queues queues(63);
    QueuePair& qp = queues.add_queue_pair(8, 4);
    ibv_sge filler{0x00007f1122334450, 64, 0x0a0b0c0d};
    for (std::uint32_t call = 0; call < 6; ++call) {
        ibv_recv_wr wrs[2] = {};
        for (std::uint32_t i = 0; i < 2; ++i) {
            wrs[i].wr_id = 0xf000 + call * 2 + i;
            wrs[i].sg_list = &filler;
            wrs[i].num_sge = 1;
            wrs[i].next = i == 0 ? &wrs[1] : nullptr;
        }
        ibv_recv_wr* bad = nullptr;
        if (ibv_post_recv(qp.qp, wrs, &bad) != 0) throw std::runtime_error("a filler post failed");
        if (call == 3) ReceiveCounters(qp.qp, qp.dv.rq.wqe_cnt, 6, 8, 0).set_tail(8);
        if (call == 4) ReceiveCounters(qp.qp, qp.dv.rq.wqe_cnt, 6, 10, 8).set_tail(10);
    }
    ReceiveCounters counters(qp.qp, qp.dv.rq.wqe_cnt, 6, 12, 10);
    json one_case = recv_case(
        "rq_fillers_completed_between_calls",
        "RC QP (max_recv_wr 8, max_recv_sge 4): 12 fillers, 2 per call, completions emulated "
        "after the fourth and fifth calls; then a 2-WR chain");
    json inputs = recv_inputs(qp, counters.head(), counters.tail());
    inputs["before_capture"] =
        "12 filler WRs (1 SGE {0x00007f1122334450, len 64, lkey 0x0a0b0c0d}) posted with "
        "ibv_post_recv, 2 per call";
    const std::vector<ReceiveSpec> list = {{0x5000, 1}, {0x5001, 2}};
    inputs["wr_list"] = json::array();
    for (const ReceiveSpec& spec : list) inputs["wr_list"].push_back(receive_json(spec));
    one_case["inputs"] = inputs;
    one_case["outputs"] = capture_receive_post(queues, qp, counters, list, poison);
    return one_case;
}

// 65534 fillers one per call, completions emulated whenever the ring is full and after the
// last: the capture's chain takes the 16-bit doorbell record past 65535 (it writes 1).
json rq_fillers_dbrec_16bit_wrap(std::uint8_t poison) {
    Libmlx5Queues queues(63);
    QueuePair& qp = queues.add_queue_pair(8, 4);
    ibv_sge filler{0x00007f1122334450, 64, 0x0a0b0c0d};
    constexpr std::uint32_t kFillers = 65534;
    std::uint32_t tail = 0;
    for (std::uint32_t head = 0; head < kFillers;) {
        if (head - tail == qp.dv.rq.wqe_cnt) {
            ReceiveCounters(qp.qp, qp.dv.rq.wqe_cnt, 6, head, tail).set_tail(head);
            tail = head;
        }
        ibv_recv_wr wr{};
        wr.wr_id = 0xf0000 + head;
        wr.sg_list = &filler;
        wr.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        if (ibv_post_recv(qp.qp, &wr, &bad) != 0) throw std::runtime_error("a filler post failed");
        ++head;
    }
    ReceiveCounters(qp.qp, qp.dv.rq.wqe_cnt, 6, kFillers, tail).set_tail(kFillers);
    ReceiveCounters counters(qp.qp, qp.dv.rq.wqe_cnt, 6, kFillers, kFillers);
    json one_case = recv_case(
        "rq_fillers_dbrec_16bit_wrap",
        "RC QP (max_recv_wr 8, max_recv_sge 4): 65534 fillers one per call, completions emulated "
        "whenever the ring is full and after the last; then a 3-WR chain (head 65534 to 65537)");
    json inputs = recv_inputs(qp, counters.head(), counters.tail());
    inputs["before_capture"] =
        "65534 filler WRs (1 SGE {0x00007f1122334450, len 64, lkey 0x0a0b0c0d}) posted with "
        "ibv_post_recv, 1 per call";
    const std::vector<ReceiveSpec> list = {{0x5100, 1}, {0x5101, 2}, {0x5102, 3}};
    inputs["wr_list"] = json::array();
    for (const ReceiveSpec& spec : list) inputs["wr_list"].push_back(receive_json(spec));
    one_case["inputs"] = inputs;
    one_case["outputs"] = capture_receive_post(queues, qp, counters, list, poison);
    return one_case;
}

json srq_state(const mlx5dv_srq& view, std::uint32_t counter) {
    return {{"head", view.head}, {"tail", view.tail}, {"counter", counter}};
}

json srq_links(const mlx5dv_srq& view, std::uint32_t count) {
    json links = json::array();
    for (std::uint32_t i = 0; i < count; ++i) {
        links.push_back(mlx5::load_big16(static_cast<const std::uint8_t*>(view.buf) +
                                         static_cast<std::size_t>(i) * view.stride + 2));
    }
    return links;
}

// SRQ receives completed out of order (one by an error CQE) before the capture, so the free
// list is relinked; the capture posts two and polls a completion of one of them.
json srq_steps_out_of_order_frees(std::uint8_t poison) {
    Libmlx5Queues queues(63);
    ibv_srq* srq = queues.add_shared_receive_queue(4, 4);
    const mlx5dv_srq created = queues.shared_receive_view();
    const auto& kernel = rdmachan::libmlx5_instructions::fake_kernel();
    const std::uint32_t kernel_max_wr =
        kernel.shared_receive_limits[kernel.shared_receive_queues - 1][0];
    const std::uint32_t count = kernel_max_wr + 1;
    ibv_srq_attr granted{};
    if (ibv_query_srq(srq, &granted) != 0) throw std::runtime_error("ibv_query_srq failed");
    QueuePair& qp = queues.add_queue_pair(0, 0, srq);
    std::uint32_t shift = 0;
    while ((1u << shift) < created.stride) ++shift;
    json inputs = {{"ibv_create_srq_attr_in", {{"max_wr", 4}, {"max_sge", 4}}},
                   {"ibv_create_srq_attr_out",
                    {{"max_wr", created.tail}, {"max_sge", (created.stride - 16) / 16}}},
                   {"MLX5_SRQ_SIGNATURE", "unset"},
                   {"srq_wq_sig", 0},
                   {"srq_after_create",
                    {{"srqn", hex_number(created.srqn)},
                     {"max", count},
                     {"max_gs", (created.stride - 16) / 16},
                     {"wqe_shift", shift},
                     {"stride_bytes", created.stride},
                     {"head", created.head},
                     {"tail", created.tail},
                     {"counter", 0}}},
                   {"srq_links_after_create", srq_links(created, count)},
                   {"srq_dbrec_after_create", record_value(created.dbrec, 0)},
                   {"attached_qp",
                    {{"qp_num", hex_number(qp.qp->qp_num)},
                     {"user_index", qp.user_index},
                     {"rq_wqe_cnt", 0}}}};
    json steps = json::array();
    std::vector<ibv_wc> wc;
    steps.push_back(queues.post_shared_receives({{0x6000, 1}, {0x6001, 2}, {0x6002, 1}}));
    CqeSpec flushed = responder(qp, mlx5::kCqeResponderError, 2);
    flushed.syndrome = mlx5::kSyndromeWorkRequestFlushed;
    flushed.vendor_syndrome = 0xf9;
    steps.push_back(
        queues.write_and_poll({responder(qp, mlx5::kCqeResponderSend, 1), flushed}, 2, poison, wc));
    steps.push_back(queues.post_shared_receives({{0x6003, 3}}));
    steps.push_back(queues.write_and_poll(
        {responder(qp, mlx5::kCqeResponderSendImmediate, 0, 0x12345678)}, 1, poison, wc));
    inputs["before_capture"] = steps;
    std::uint32_t counter = 4;  // SRQ receives posted so far

    // The capture: a post over poisoned WQE bodies and doorbell record (each WQE's next segment
    // keeps its link, bytes 2-3, which the list lives in), then a poll.
    auto* buffer = static_cast<std::uint8_t*>(created.buf);
    std::vector<std::uint8_t> links_before(count * 2);
    for (std::uint32_t i = 0; i < count; ++i) {
        std::uint8_t* wqe = buffer + static_cast<std::size_t>(i) * created.stride;
        links_before[2 * i] = wqe[2];
        links_before[2 * i + 1] = wqe[3];
        std::memset(wqe, poison, 2);
        std::memset(wqe + 4, poison, created.stride - 4);
    }
    std::memset(const_cast<std::uint32_t*>(created.dbrec), poison, 4);
    mlx5dv_srq view = queues.shared_receive_view();
    json post = {{"srq_before", srq_state(view, counter)},
                 {"srq_links_before", srq_links(view, count)}};
    const std::uint32_t first_index = view.head;
    json posted = queues.post_shared_receives({{0x7000, 1}, {0x7001, 4}});
    post["op"] = "ibv_post_srq_recv";
    post["wr_list"] = posted.at("wr_list");
    post["return_code"] = posted.at("return_code");
    post["bad_wr_index"] = posted.at("bad_wr_index");
    counter += 2;
    view = queues.shared_receive_view();
    post["srq_after"] = srq_state(view, record_value(view.dbrec, 0));
    if (record_value(view.dbrec, 0) != counter) throw std::runtime_error("unexpected SRQ counter");
    post["srq_links_after"] = srq_links(view, count);
    post["wqes"] = json::array();
    for (std::uint32_t index = first_index, i = 0; i < 2; ++i) {
        std::uint8_t* wqe = buffer + static_cast<std::size_t>(index) * created.stride;
        json entry = written_region(wqe, created.stride, poison);
        // The link bytes were not poisoned: written only if they changed.
        std::string mask = entry.at("written_mask_hex").get<std::string>();
        const bool link_changed =
            wqe[2] != links_before[2 * index] || wqe[3] != links_before[2 * index + 1];
        mask.replace(4, 4, link_changed ? "ffff" : "0000");
        entry["written_mask_hex"] = mask;
        entry["srq_index"] = index;
        post["wqes"].push_back(entry);
        index = mlx5::load_big16(wqe + 2);
    }
    json dbrec = written_region(const_cast<std::uint32_t*>(view.dbrec), 4, poison);
    dbrec["value"] = record_value(view.dbrec, 0);
    post["srq_dbrec"] = dbrec;

    json poll = {{"state_before",
                  {{"cq_cons_index", queues.consumer_index()},
                   {"srq", srq_state(view, counter)},
                   {"srq_links", srq_links(view, count)}}}};
    std::memset(const_cast<std::uint32_t*>(queues.cq().dbrec), poison, 8);
    json polled = queues.write_and_poll(
        {responder(qp, mlx5::kCqeResponderSend, static_cast<std::uint16_t>(first_index))}, 2,
        poison, wc);
    view = queues.shared_receive_view();
    poll["op"] = "ibv_poll_cq";
    poll["cqes_written"] = polled.at("cqes_written");
    poll["ne"] = 2;
    poll["return_code"] = polled.at("return_code");
    poll["wc"] = polled.at("wc");
    poll["state_after"] = {{"cq_cons_index", queues.consumer_index()},
                           {"srq", srq_state(view, counter)},
                           {"srq_links", srq_links(view, count)}};
    json cq_dbrec = written_region(const_cast<std::uint32_t*>(queues.cq().dbrec), 8, poison);
    cq_dbrec["set_ci_value"] = record_value(queues.cq().dbrec, 0);
    poll["cq_dbrec"] = cq_dbrec;
    return {{"name", "srq_steps_out_of_order_frees"},
            {"kind", "srq_wqe"},
            {"api", "ibv_post_srq_recv"},
            {"description",
             "SRQ (max_wr 4, max_sge 4): 3 posted, completed 1 then 2 (flush error), 1 posted, 0 "
             "completed; then a 2-WR chain and a completion of its first WQE"},
            {"inputs", inputs},
            {"steps", json::array({post, poll})}};
}

// The outputs of a cqe case: `cqes` written and `ne` polled, with the state before and after.
json capture_poll(Libmlx5Queues& queues, const std::vector<CqeSpec>& cqes, std::uint32_t ne,
                  std::uint8_t poison, const std::function<json()>& state) {
    json outputs;
    json before = state();
    before["cq_cons_index"] = queues.consumer_index();
    std::memset(const_cast<std::uint32_t*>(queues.cq().dbrec), poison, 8);
    std::vector<ibv_wc> wc;
    json polled = queues.write_and_poll(cqes, ne, poison, wc);
    json after = state();
    after["cq_cons_index"] = queues.consumer_index();
    json cq_dbrec = written_region(const_cast<std::uint32_t*>(queues.cq().dbrec), 8, poison);
    cq_dbrec["set_ci_value"] = record_value(queues.cq().dbrec, 0);
    return {{"cqes_written", polled.at("cqes_written")},
            {"ne", ne},
            {"return_code", polled.at("return_code")},
            {"state_before", before},
            {"state_after", after},
            {"cq_dbrec", cq_dbrec},
            {"wc", polled.at("wc")}};
}

json qp_inputs(const QueuePair& qp) {
    json rq = receive_queue_geometry(qp);
    rq["head"] = 0;
    rq["tail"] = 0;
    return {{"qp_num", hex_number(qp.qp->qp_num)},
            {"user_index", qp.user_index},
            {"sq_wqe_cnt", qp.dv.sq.wqe_cnt},
            {"srq", false},
            {"qp_type", "IBV_QPT_RC"},
            {"rq", rq}};
}

json setup_inputs() {
    return {{"pre_polled_cqes", 0},
            {"unsignaled_rdma_write_fillers", 0},
            {"send_wrs", json::array()},
            {"recv_wrs", json::array()},
            {"posted_to", "QP A receive queue"},
            {"rq_completions_emulated_before", 0},
            {"qp_b_recv_wrs", 0}};
}

json cqe_case(const char* name, const char* description, Libmlx5Queues& queues,
              const QueuePair& qp_a, const json& qp_b, const json& setup) {
    return {{"name", name},
            {"kind", "cqe"},
            {"api", "ibv_poll_cq"},
            {"description", description},
            {"inputs",
             {{"cq", queues.cq_inputs()},
              {"qp_a", qp_inputs(qp_a)},
              {"qp_b", qp_b},
              {"setup", setup}}}};
}

// Seven receives completed by emulation before the setup's two, which then sit at slots 7
// and 0: responder CQEs after the receive queue wrapped (head 9, tail 7 before the poll).
json resp_send_after_rq_wrap_emulated(std::uint8_t poison) {
    Libmlx5Queues queues(63);
    QueuePair& qp = queues.add_queue_pair(8, 4);
    std::vector<ReceiveSpec> fillers;
    for (std::uint32_t i = 0; i < 7; ++i) fillers.push_back({0xe000 + i, 1});
    queues.post_receives(qp, fillers);
    ReceiveCounters(qp.qp, qp.dv.rq.wqe_cnt, 6, 7, 0).set_tail(7);
    const std::vector<ReceiveSpec> receives = {{0x8000, 1}, {0x8001, 2}};
    queues.post_receives(qp, receives);
    ReceiveCounters counters(qp.qp, qp.dv.rq.wqe_cnt, 6, 9, 7);
    json setup = setup_inputs();
    for (const ReceiveSpec& spec : receives) setup["recv_wrs"].push_back(receive_json(spec));
    setup["rq_completions_emulated_before"] = 7;
    json one_case = cqe_case(
        "resp_send_after_rq_wrap_emulated",
        "RC QP (8 receive WQEs): 7 receives completed by emulation (rq.tail = rq.head), then 2 "
        "posted at slots 7 and 0; RESP_SEND and RESP_SEND_IMM CQEs for them",
        queues, qp, {{"qp_num", "0x0"}, {"user_index", 0xffffff}}, setup);
    one_case["outputs"] =
        capture_poll(queues,
                     {responder(qp, mlx5::kCqeResponderSend, 7),
                      responder(qp, mlx5::kCqeResponderSendImmediate, 8, 0x12345678)},
                     2, poison, [&] {
                         return json{{"qp_a_rq", rq_state(counters)}};
                     });
    return one_case;
}

// An 8-entry CQ whose first pass was eight responder CQEs polled with no receive posted
// (libmlx5 v44 takes wrid[tail] and advances the tail regardless); the capture's requester CQE
// is the first of the second pass (owner bit 1).
json cq_owner_wrap_pre_polled_without_receives(std::uint8_t poison) {
    Libmlx5Queues queues(7);
    if (queues.cq().cqe_cnt != 8) throw std::runtime_error("the CQ is not 8 entries");
    QueuePair& qp = queues.add_queue_pair(8, 4);
    json send = queues.post_send(qp, 0x9000);
    std::vector<ibv_wc> wc;
    queues.write_and_poll(responder_sends(qp, 0, 8), 8, poison, wc);
    ReceiveCounters counters(qp.qp, qp.dv.rq.wqe_cnt, 6, 0, 8);
    json setup = setup_inputs();
    json wr = send.at("wr_list").at(0);
    setup["send_wrs"] = json::array({{{"wr_id", wr.at("wr_id")},
                                      {"opcode", "IBV_WR_SEND"},
                                      {"send_flags", wr.at("send_flags")},
                                      {"sge", wr.at("sg_list").at(0)},
                                      {"wqe_index", 0}}});
    setup["pre_polled_cqes"] = 8;
    json one_case = cqe_case(
        "cq_owner_wrap_pre_polled_without_receives",
        "8-entry CQ: 8 RESP_SEND CQEs polled with no receive posted, then the requester CQE of "
        "a signaled SEND at ci 8 (owner bit 1)",
        queues, qp, {{"qp_num", "0x0"}, {"user_index", 0xffffff}}, setup);
    one_case["outputs"] = capture_poll(queues, {requester_send(qp, 0)}, 2, poison, [&] {
        return json{{"qp_a_rq", rq_state(counters)}};
    });
    return one_case;
}

// Receives on two QPs of one CQ, QP B's listed with their SGEs: completions alternate between
// the QPs in one poll.
json cq_mixed_qps_qp_b_receives(std::uint8_t poison) {
    Libmlx5Queues queues(63);
    QueuePair& qp_a = queues.add_queue_pair(8, 4);
    QueuePair& qp_b = queues.add_queue_pair(8, 4);
    const std::vector<ReceiveSpec> receives_a = {{0xa000, 1}};
    const std::vector<ReceiveSpec> receives_b = {{0xb000, 2}, {0xb001, 1}};
    queues.post_receives(qp_a, receives_a);
    queues.post_receives(qp_b, receives_b);
    ReceiveCounters counters_a(qp_a.qp, qp_a.dv.rq.wqe_cnt, 6, 1, 0);
    ReceiveCounters counters_b(qp_b.qp, qp_b.dv.rq.wqe_cnt, 6, 2, 0);
    json setup = setup_inputs();
    for (const ReceiveSpec& spec : receives_a) setup["recv_wrs"].push_back(receive_json(spec));
    setup["qp_b_recv_wrs"] = json::array();
    for (const ReceiveSpec& spec : receives_b) setup["qp_b_recv_wrs"].push_back(receive_json(spec));
    json one_case = cqe_case(
        "cq_mixed_qps_qp_b_receives",
        "Two RC QPs on one CQ, QP A with 1 receive and QP B with 2 (listed with their SGEs): "
        "RESP_SEND for B, RESP_SEND_IMM for A, RESP_SEND_INV for B in one poll",
        queues, qp_a, {{"qp_num", hex_number(qp_b.qp->qp_num)}, {"user_index", qp_b.user_index}},
        setup);
    one_case["outputs"] = capture_poll(
        queues,
        {responder(qp_b, mlx5::kCqeResponderSend, 0),
         responder(qp_a, mlx5::kCqeResponderSendImmediate, 0, 0x12345678),
         responder(qp_b, mlx5::kCqeResponderSendInvalidate, 1, 0x00c0ffee)},
        4, poison, [&] {
            return json{{"qp_a_rq", rq_state(counters_a)}, {"qp_b_rq", rq_state(counters_b)}};
        });
    return one_case;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s OUTPUT.json\n", argv[0]);
        return 2;
    }
    try {
        json cases = json::array();
        for (const auto& make : std::vector<std::function<json(std::uint8_t)>>{
                 rq_steps_wrap_after_polls, rq_fillers_completed_between_calls,
                 rq_fillers_dbrec_16bit_wrap, srq_steps_out_of_order_frees,
                 resp_send_after_rq_wrap_emulated, cq_owner_wrap_pre_polled_without_receives,
                 cq_mixed_qps_qp_b_receives}) {
            cases.push_back(merge_runs(make(kPoisons[0]), make(kPoisons[1])));
        }
        std::ofstream output(argv[1]);
        output << cases.dump(1) << "\n";
        if (!output) {
            std::fprintf(stderr, "mlx5-golden-capture: cannot write %s\n", argv[1]);
            return 2;
        }
    } catch (const std::exception& error) {
        std::fprintf(stderr, "mlx5-golden-capture: %s\n", error.what());
        return 1;
    }
    return 0;
}
