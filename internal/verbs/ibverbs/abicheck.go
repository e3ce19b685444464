//go:build ibverbs_abicheck && cgo && linux

package ibverbs

// This file only compiles: it proves at build time that shim.h's layouts
// and constants match the real <infiniband/verbs.h> and <rdma/rdma_cma.h>.
// Build it with `go vet -tags ibverbs_abicheck ./internal/verbs/ibverbs`
// on a host with libibverbs-dev and librdmacm-dev (make test does). A mismatch is a compile error naming
// the field.

/*
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include "shim.h"

#define SAME(rs, ibv, f) \
	_Static_assert(offsetof(struct rs, f) == offsetof(struct ibv, f), #ibv "." #f " moved"); \
	_Static_assert(sizeof(((struct rs *)0)->f) == sizeof(((struct ibv *)0)->f), #ibv "." #f " resized")
#define SIZE(rs, ibv) _Static_assert(sizeof(struct rs) == sizeof(struct ibv), #ibv " resized")
#define VAL(rs, ibv) _Static_assert((long)(rs) == (long)(ibv), #ibv " changed")

SAME(rs_context, ibv_context, device);
SAME(rs_context, ibv_context, ops);
SAME(rs_context, ibv_context, cmd_fd);
SAME(rs_context, ibv_context, async_fd);
SAME(rs_context, ibv_context, num_comp_vectors);
SIZE(rs_context_ops, ibv_context_ops);
SAME(rs_context_ops, ibv_context_ops, poll_cq);
SAME(rs_context_ops, ibv_context_ops, req_notify_cq);
SAME(rs_context_ops, ibv_context_ops, post_send);
SAME(rs_context_ops, ibv_context_ops, post_recv);
SAME(rs_cq, ibv_cq, context);
SAME(rs_qp, ibv_qp, context);
SAME(rs_qp, ibv_qp, qp_num);
SIZE(rs_mr, ibv_mr);
SAME(rs_mr, ibv_mr, addr);
SAME(rs_mr, ibv_mr, length);
SAME(rs_mr, ibv_mr, lkey);
SAME(rs_mr, ibv_mr, rkey);
SIZE(rs_comp_channel, ibv_comp_channel);
SAME(rs_comp_channel, ibv_comp_channel, fd);
SIZE(rs_wc, ibv_wc);
SAME(rs_wc, ibv_wc, wr_id);
SAME(rs_wc, ibv_wc, status);
SAME(rs_wc, ibv_wc, opcode);
SAME(rs_wc, ibv_wc, vendor_err);
SAME(rs_wc, ibv_wc, byte_len);
SAME(rs_wc, ibv_wc, imm_data);
SAME(rs_wc, ibv_wc, qp_num);
SAME(rs_wc, ibv_wc, src_qp);
SAME(rs_wc, ibv_wc, wc_flags);
SAME(rs_wc, ibv_wc, pkey_index);
SAME(rs_wc, ibv_wc, slid);
SAME(rs_wc, ibv_wc, sl);
SAME(rs_wc, ibv_wc, dlid_path_bits);
SIZE(rs_sge, ibv_sge);
SAME(rs_sge, ibv_sge, addr);
SAME(rs_sge, ibv_sge, length);
SAME(rs_sge, ibv_sge, lkey);
SIZE(rs_send_wr, ibv_send_wr);
SAME(rs_send_wr, ibv_send_wr, wr_id);
SAME(rs_send_wr, ibv_send_wr, next);
SAME(rs_send_wr, ibv_send_wr, sg_list);
SAME(rs_send_wr, ibv_send_wr, num_sge);
SAME(rs_send_wr, ibv_send_wr, opcode);
SAME(rs_send_wr, ibv_send_wr, send_flags);
SAME(rs_send_wr, ibv_send_wr, imm_data);
SAME(rs_send_wr, ibv_send_wr, wr.rdma.remote_addr);
SAME(rs_send_wr, ibv_send_wr, wr.rdma.rkey);
SIZE(rs_recv_wr, ibv_recv_wr);
SAME(rs_recv_wr, ibv_recv_wr, wr_id);
SAME(rs_recv_wr, ibv_recv_wr, sg_list);
SAME(rs_recv_wr, ibv_recv_wr, num_sge);
SIZE(rs_qp_cap, ibv_qp_cap);
SAME(rs_qp_cap, ibv_qp_cap, max_inline_data);
SIZE(rs_qp_init_attr, ibv_qp_init_attr);
SAME(rs_qp_init_attr, ibv_qp_init_attr, send_cq);
SAME(rs_qp_init_attr, ibv_qp_init_attr, recv_cq);
SAME(rs_qp_init_attr, ibv_qp_init_attr, cap);
SAME(rs_qp_init_attr, ibv_qp_init_attr, qp_type);
SAME(rs_qp_init_attr, ibv_qp_init_attr, sq_sig_all);
SIZE(rs_global_route, ibv_global_route);
SAME(rs_global_route, ibv_global_route, dgid);
SAME(rs_global_route, ibv_global_route, sgid_index);
SAME(rs_global_route, ibv_global_route, hop_limit);
SIZE(rs_ah_attr, ibv_ah_attr);
SAME(rs_ah_attr, ibv_ah_attr, dlid);
SAME(rs_ah_attr, ibv_ah_attr, is_global);
SAME(rs_ah_attr, ibv_ah_attr, port_num);
SIZE(rs_qp_attr, ibv_qp_attr);
SAME(rs_qp_attr, ibv_qp_attr, qp_state);
SAME(rs_qp_attr, ibv_qp_attr, path_mtu);
SAME(rs_qp_attr, ibv_qp_attr, rq_psn);
SAME(rs_qp_attr, ibv_qp_attr, sq_psn);
SAME(rs_qp_attr, ibv_qp_attr, dest_qp_num);
SAME(rs_qp_attr, ibv_qp_attr, qp_access_flags);
SAME(rs_qp_attr, ibv_qp_attr, ah_attr);
SAME(rs_qp_attr, ibv_qp_attr, pkey_index);
SAME(rs_qp_attr, ibv_qp_attr, max_rd_atomic);
SAME(rs_qp_attr, ibv_qp_attr, max_dest_rd_atomic);
SAME(rs_qp_attr, ibv_qp_attr, min_rnr_timer);
SAME(rs_qp_attr, ibv_qp_attr, port_num);
SAME(rs_qp_attr, ibv_qp_attr, timeout);
SAME(rs_qp_attr, ibv_qp_attr, retry_cnt);
SAME(rs_qp_attr, ibv_qp_attr, rnr_retry);
SAME(rs_port_attr, ibv_port_attr, state);
SAME(rs_port_attr, ibv_port_attr, active_mtu);
SAME(rs_port_attr, ibv_port_attr, lid);
SAME(rs_port_attr, ibv_port_attr, link_layer);
_Static_assert(sizeof(union rs_port_buf) >= 2 * sizeof(struct ibv_port_attr), "port buffer too small");
SAME(rs_device_attr, ibv_device_attr, fw_ver);
SAME(rs_device_attr, ibv_device_attr, node_guid);
SAME(rs_device_attr, ibv_device_attr, sys_image_guid);
SAME(rs_device_attr, ibv_device_attr, max_mr_size);
SAME(rs_device_attr, ibv_device_attr, page_size_cap);
SAME(rs_device_attr, ibv_device_attr, vendor_id);
SAME(rs_device_attr, ibv_device_attr, vendor_part_id);
SAME(rs_device_attr, ibv_device_attr, hw_ver);
SAME(rs_device_attr, ibv_device_attr, max_qp);
SAME(rs_device_attr, ibv_device_attr, max_qp_wr);
SAME(rs_device_attr, ibv_device_attr, device_cap_flags);
SAME(rs_device_attr, ibv_device_attr, max_sge);
SAME(rs_device_attr, ibv_device_attr, max_sge_rd);
SAME(rs_device_attr, ibv_device_attr, max_cq);
SAME(rs_device_attr, ibv_device_attr, max_cqe);
_Static_assert(sizeof(union rs_device_buf) >= 2 * sizeof(struct ibv_device_attr), "device buffer too small");
SIZE(rs_async_event, ibv_async_event);
SAME(rs_async_event, ibv_async_event, event_type);

VAL(RS_ACCESS_LOCAL_WRITE, IBV_ACCESS_LOCAL_WRITE);
VAL(RS_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_WRITE);
VAL(RS_QPT_RC, IBV_QPT_RC);
VAL(RS_QPS_RESET, IBV_QPS_RESET);
VAL(RS_QPS_INIT, IBV_QPS_INIT);
VAL(RS_QPS_RTR, IBV_QPS_RTR);
VAL(RS_QPS_RTS, IBV_QPS_RTS);
VAL(RS_QPS_ERR, IBV_QPS_ERR);
VAL(RS_QP_STATE, IBV_QP_STATE);
VAL(RS_QP_ACCESS_FLAGS, IBV_QP_ACCESS_FLAGS);
VAL(RS_QP_PKEY_INDEX, IBV_QP_PKEY_INDEX);
VAL(RS_QP_PORT, IBV_QP_PORT);
VAL(RS_QP_AV, IBV_QP_AV);
VAL(RS_QP_PATH_MTU, IBV_QP_PATH_MTU);
VAL(RS_QP_TIMEOUT, IBV_QP_TIMEOUT);
VAL(RS_QP_RETRY_CNT, IBV_QP_RETRY_CNT);
VAL(RS_QP_RNR_RETRY, IBV_QP_RNR_RETRY);
VAL(RS_QP_RQ_PSN, IBV_QP_RQ_PSN);
VAL(RS_QP_MAX_QP_RD_ATOMIC, IBV_QP_MAX_QP_RD_ATOMIC);
VAL(RS_QP_MIN_RNR_TIMER, IBV_QP_MIN_RNR_TIMER);
VAL(RS_QP_SQ_PSN, IBV_QP_SQ_PSN);
VAL(RS_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MAX_DEST_RD_ATOMIC);
VAL(RS_QP_DEST_QPN, IBV_QP_DEST_QPN);
VAL(RS_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE);
VAL(RS_WR_SEND, IBV_WR_SEND);
VAL(RS_SEND_SIGNALED, IBV_SEND_SIGNALED);
VAL(RS_SEND_SOLICITED, IBV_SEND_SOLICITED);
VAL(RS_SEND_INLINE, IBV_SEND_INLINE);
VAL(RS_WC_SUCCESS, IBV_WC_SUCCESS);
VAL(RS_WC_LOC_LEN_ERR, IBV_WC_LOC_LEN_ERR);
VAL(RS_WC_WR_FLUSH_ERR, IBV_WC_WR_FLUSH_ERR);
VAL(RS_WC_REM_ACCESS_ERR, IBV_WC_REM_ACCESS_ERR);
VAL(RS_WC_RETRY_EXC_ERR, IBV_WC_RETRY_EXC_ERR);
VAL(RS_WC_RNR_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR);
VAL(RS_WC_SEND, IBV_WC_SEND);
VAL(RS_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE);
VAL(RS_WC_RECV, IBV_WC_RECV);
VAL(RS_WC_RECV_RDMA_WITH_IMM, IBV_WC_RECV_RDMA_WITH_IMM);
VAL(RS_WC_WITH_IMM, IBV_WC_WITH_IMM);
VAL(RS_PORT_ACTIVE, IBV_PORT_ACTIVE);
VAL(RS_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_INFINIBAND);
VAL(RS_LINK_LAYER_ETHERNET, IBV_LINK_LAYER_ETHERNET);
VAL(RS_EVENT_CQ_ERR, IBV_EVENT_CQ_ERR);
VAL(RS_EVENT_QP_FATAL, IBV_EVENT_QP_FATAL);
VAL(RS_EVENT_QP_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
VAL(RS_EVENT_QP_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
VAL(RS_EVENT_DEVICE_FATAL, IBV_EVENT_DEVICE_FATAL);
VAL(RS_EVENT_PORT_ACTIVE, IBV_EVENT_PORT_ACTIVE);
VAL(RS_EVENT_PORT_ERR, IBV_EVENT_PORT_ERR);

SIZE(rs_cm_channel, rdma_event_channel);
SAME(rs_cm_id, rdma_cm_id, verbs);
SAME(rs_cm_id, rdma_cm_id, channel);
SAME(rs_cm_id, rdma_cm_id, context);
SAME(rs_cm_id, rdma_cm_id, qp);
_Static_assert(offsetof(struct rs_cm_id, src) == offsetof(struct rdma_cm_id, route.addr.src_storage), "rdma_cm_id.route.addr.src moved");
_Static_assert(offsetof(struct rs_cm_id, dst) == offsetof(struct rdma_cm_id, route.addr.dst_storage), "rdma_cm_id.route.addr.dst moved");
SIZE(rs_conn_param, rdma_conn_param);
SAME(rs_conn_param, rdma_conn_param, private_data);
SAME(rs_conn_param, rdma_conn_param, private_data_len);
SAME(rs_conn_param, rdma_conn_param, responder_resources);
SAME(rs_conn_param, rdma_conn_param, initiator_depth);
SAME(rs_conn_param, rdma_conn_param, retry_count);
SAME(rs_conn_param, rdma_conn_param, rnr_retry_count);
SAME(rs_conn_param, rdma_conn_param, qp_num);
SAME(rs_cm_event, rdma_cm_event, id);
SAME(rs_cm_event, rdma_cm_event, listen_id);
SAME(rs_cm_event, rdma_cm_event, event);
SAME(rs_cm_event, rdma_cm_event, status);
SAME(rs_cm_event, rdma_cm_event, param.conn);
VAL(RS_PS_TCP, RDMA_PS_TCP);
SIZE(rs_path_data, ibv_path_data);
SAME(rs_path_data, ibv_path_data, flags);
SAME(rs_path_data, ibv_path_data, path);
VAL(RS_CM_OPTION_IB, RDMA_OPTION_IB);
VAL(RS_CM_OPTION_IB_PATH, RDMA_OPTION_IB_PATH);
VAL(RS_PATH_FLAGS, IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY | IBV_PATH_FLAG_BIDIRECTIONAL);
VAL(RS_CM_ADDR_RESOLVED, RDMA_CM_EVENT_ADDR_RESOLVED);
VAL(RS_CM_ADDR_ERROR, RDMA_CM_EVENT_ADDR_ERROR);
VAL(RS_CM_ROUTE_RESOLVED, RDMA_CM_EVENT_ROUTE_RESOLVED);
VAL(RS_CM_ROUTE_ERROR, RDMA_CM_EVENT_ROUTE_ERROR);
VAL(RS_CM_CONNECT_REQUEST, RDMA_CM_EVENT_CONNECT_REQUEST);
VAL(RS_CM_CONNECT_RESPONSE, RDMA_CM_EVENT_CONNECT_RESPONSE);
VAL(RS_CM_CONNECT_ERROR, RDMA_CM_EVENT_CONNECT_ERROR);
VAL(RS_CM_UNREACHABLE, RDMA_CM_EVENT_UNREACHABLE);
VAL(RS_CM_REJECTED, RDMA_CM_EVENT_REJECTED);
VAL(RS_CM_ESTABLISHED, RDMA_CM_EVENT_ESTABLISHED);
VAL(RS_CM_DISCONNECTED, RDMA_CM_EVENT_DISCONNECTED);
VAL(RS_CM_DEVICE_REMOVAL, RDMA_CM_EVENT_DEVICE_REMOVAL);
VAL(RS_CM_ADDR_CHANGE, RDMA_CM_EVENT_ADDR_CHANGE);
VAL(RS_CM_TIMEWAIT_EXIT, RDMA_CM_EVENT_TIMEWAIT_EXIT);
*/
import "C"
