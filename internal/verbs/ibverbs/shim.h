// shim.h: the parts of libibverbs' ABI that rsock uses, declared here so
// that building needs no rdma-core headers. libibverbs is loaded at run
// time with dlopen (see shim.c).
//
// The layouts follow rdma-core's <infiniband/verbs.h> (ABI IBVERBS_1.1,
// stable since 2008). Every struct here is checked field by field against
// the real header by abicheck.go (build tag ibverbs_abicheck), which
// `make test` compiles where the header is installed.
#ifndef RSOCK_IBVERBS_SHIM_H
#define RSOCK_IBVERBS_SHIM_H

#include <stddef.h>
#include <stdint.h>

// Opaque objects: rsock only passes their pointers back.
struct rs_device;
struct rs_pd;

// struct ibv_context_ops: 32 function pointers. rsock calls four of them
// directly, as libibverbs' inline ibv_poll_cq, ibv_req_notify_cq,
// ibv_post_send and ibv_post_recv do.
struct rs_cq;
struct rs_qp;
struct rs_wc;
struct rs_send_wr;
struct rs_recv_wr;
struct rs_context_ops {
	void *skip0[11];
	int (*poll_cq)(struct rs_cq *cq, int num_entries, struct rs_wc *wc);
	int (*req_notify_cq)(struct rs_cq *cq, int solicited_only);
	void *skip13[12];
	int (*post_send)(struct rs_qp *qp, struct rs_send_wr *wr, struct rs_send_wr **bad);
	int (*post_recv)(struct rs_qp *qp, struct rs_recv_wr *wr, struct rs_recv_wr **bad);
	void *skip27[5];
};

struct rs_context {
	struct rs_device *device;
	struct rs_context_ops ops;
	int cmd_fd;
	int async_fd;
	int num_comp_vectors;
	// (a pthread mutex and a pointer follow; never touched)
};

// struct ibv_cq: rsock reads only its context.
struct rs_cq {
	struct rs_context *context;
};

// struct ibv_qp, up to qp_num.
struct rs_qp {
	struct rs_context *context;
	void *qp_context;
	struct rs_pd *pd;
	struct rs_cq *send_cq;
	struct rs_cq *recv_cq;
	void *srq;
	uint32_t handle;
	uint32_t qp_num;
};

// struct ibv_mr.
struct rs_mr {
	struct rs_context *context;
	struct rs_pd *pd;
	void *addr;
	size_t length;
	uint32_t handle;
	uint32_t lkey;
	uint32_t rkey;
};

// struct ibv_comp_channel.
struct rs_comp_channel {
	struct rs_context *context;
	int fd;
	int refcnt;
};

// struct ibv_wc.
struct rs_wc {
	uint64_t wr_id;
	uint32_t status; // enum ibv_wc_status
	uint32_t opcode; // enum ibv_wc_opcode
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm_data; // network byte order
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t wc_flags;
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
};

// struct ibv_sge.
struct rs_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

// struct ibv_send_wr. The trailing unions (xrc, bind_mw, tso) are kept as
// padding of the right size and alignment.
struct rs_send_wr {
	uint64_t wr_id;
	struct rs_send_wr *next;
	struct rs_sge *sg_list;
	int num_sge;
	uint32_t opcode; // enum ibv_wr_opcode
	uint32_t send_flags;
	uint32_t imm_data; // network byte order
	union {
		struct {
			uint64_t remote_addr;
			uint32_t rkey;
		} rdma;
		uint64_t atomic_pad[4];
	} wr;
	uint32_t xrc_remote_srqn;
	union {
		struct {
			void *mw;
			uint32_t rkey;
			struct {
				void *mr;
				uint64_t addr;
				uint64_t length;
				unsigned int access;
			} info;
		} bind_mw;
	} tail;
};

// struct ibv_recv_wr.
struct rs_recv_wr {
	uint64_t wr_id;
	struct rs_recv_wr *next;
	struct rs_sge *sg_list;
	int num_sge;
};

// struct ibv_qp_cap.
struct rs_qp_cap {
	uint32_t max_send_wr;
	uint32_t max_recv_wr;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
};

// struct ibv_qp_init_attr.
struct rs_qp_init_attr {
	void *qp_context;
	struct rs_cq *send_cq;
	struct rs_cq *recv_cq;
	void *srq;
	struct rs_qp_cap cap;
	uint32_t qp_type; // enum ibv_qp_type
	int sq_sig_all;
};

// struct ibv_global_route and struct ibv_ah_attr.
struct rs_global_route {
	union {
		uint8_t raw[16];
		uint64_t align; // union ibv_gid holds two uint64_t
	} dgid;
	uint32_t flow_label;
	uint8_t sgid_index;
	uint8_t hop_limit;
	uint8_t traffic_class;
};

struct rs_ah_attr {
	struct rs_global_route grh;
	uint16_t dlid;
	uint8_t sl;
	uint8_t src_path_bits;
	uint8_t static_rate;
	uint8_t is_global;
	uint8_t port_num;
};

// struct ibv_qp_attr.
struct rs_qp_attr {
	uint32_t qp_state;       // enum ibv_qp_state
	uint32_t cur_qp_state;   // enum ibv_qp_state
	uint32_t path_mtu;       // enum ibv_mtu
	uint32_t path_mig_state; // enum ibv_mig_state
	uint32_t qkey;
	uint32_t rq_psn;
	uint32_t sq_psn;
	uint32_t dest_qp_num;
	unsigned int qp_access_flags;
	struct rs_qp_cap cap;
	struct rs_ah_attr ah_attr;
	struct rs_ah_attr alt_ah_attr;
	uint16_t pkey_index;
	uint16_t alt_pkey_index;
	uint8_t en_sqd_async_notify;
	uint8_t sq_draining;
	uint8_t max_rd_atomic;
	uint8_t max_dest_rd_atomic;
	uint8_t min_rnr_timer;
	uint8_t port_num;
	uint8_t timeout;
	uint8_t retry_cnt;
	uint8_t rnr_retry;
	uint8_t alt_port_num;
	uint8_t alt_timeout;
	uint32_t rate_limit;
};

// struct ibv_port_attr, the fields rsock reads. ibv_query_port is given a
// zeroed buffer larger than the real struct (rs_port_buf), so a library
// that writes a newer, longer layout cannot overrun it.
struct rs_port_attr {
	uint32_t state;      // enum ibv_port_state
	uint32_t max_mtu;    // enum ibv_mtu
	uint32_t active_mtu; // enum ibv_mtu
	int gid_tbl_len;
	uint32_t port_cap_flags;
	uint32_t max_msg_sz;
	uint32_t bad_pkey_cntr;
	uint32_t qkey_viol_cntr;
	uint16_t pkey_tbl_len;
	uint16_t lid;
	uint16_t sm_lid;
	uint8_t lmc;
	uint8_t max_vl_num;
	uint8_t sm_sl;
	uint8_t subnet_timeout;
	uint8_t init_type_reply;
	uint8_t active_width;
	uint8_t active_speed;
	uint8_t phys_state;
	uint8_t link_layer;
	uint8_t flags;
};

union rs_port_buf {
	struct rs_port_attr attr;
	uint8_t room[256];
};

// struct ibv_device_attr, up to max_cqe: the limits rsock checks its
// queue depths against. ibv_query_device writes the whole struct, so it
// is given a zeroed buffer larger than the real one (rs_device_buf), as
// ibv_query_port is.
struct rs_device_attr {
	char fw_ver[64];
	uint64_t node_guid;      // __be64
	uint64_t sys_image_guid; // __be64
	uint64_t max_mr_size;
	uint64_t page_size_cap;
	uint32_t vendor_id;
	uint32_t vendor_part_id;
	uint32_t hw_ver;
	int max_qp;
	int max_qp_wr;
	unsigned int device_cap_flags;
	int max_sge;
	int max_sge_rd;
	int max_cq;
	int max_cqe;
	// (more limits follow; never touched)
};

union rs_device_buf {
	struct rs_device_attr attr;
	uint8_t room[512];
};

// struct ibv_async_event.
struct rs_async_event {
	union {
		struct rs_cq *cq;
		struct rs_qp *qp;
		void *srq;
		void *wq;
		int port_num;
	} element;
	uint32_t event_type; // enum ibv_event_type
};

// Constants of the ABI (enum values of <infiniband/verbs.h>).
enum {
	RS_ACCESS_LOCAL_WRITE = 1,
	RS_ACCESS_REMOTE_WRITE = 2,

	RS_QPT_RC = 2,

	RS_QPS_RESET = 0,
	RS_QPS_INIT = 1,
	RS_QPS_RTR = 2,
	RS_QPS_RTS = 3,
	RS_QPS_ERR = 6,

	RS_QP_STATE = 1 << 0,
	RS_QP_ACCESS_FLAGS = 1 << 3,
	RS_QP_PKEY_INDEX = 1 << 4,
	RS_QP_PORT = 1 << 5,
	RS_QP_AV = 1 << 7,
	RS_QP_PATH_MTU = 1 << 8,
	RS_QP_TIMEOUT = 1 << 9,
	RS_QP_RETRY_CNT = 1 << 10,
	RS_QP_RNR_RETRY = 1 << 11,
	RS_QP_RQ_PSN = 1 << 12,
	RS_QP_MAX_QP_RD_ATOMIC = 1 << 13,
	RS_QP_MIN_RNR_TIMER = 1 << 15,
	RS_QP_SQ_PSN = 1 << 16,
	RS_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
	RS_QP_DEST_QPN = 1 << 20,

	RS_WR_RDMA_WRITE = 0,
	RS_WR_SEND = 2,

	RS_SEND_SIGNALED = 1 << 1,
	RS_SEND_SOLICITED = 1 << 2,
	RS_SEND_INLINE = 1 << 3,

	RS_WC_SUCCESS = 0,
	RS_WC_LOC_LEN_ERR = 1,
	RS_WC_WR_FLUSH_ERR = 5,
	RS_WC_REM_ACCESS_ERR = 10,
	RS_WC_RETRY_EXC_ERR = 12,
	RS_WC_RNR_RETRY_EXC_ERR = 13,

	RS_WC_SEND = 0,
	RS_WC_RDMA_WRITE = 1,
	RS_WC_RECV = 1 << 7,
	RS_WC_RECV_RDMA_WITH_IMM = (1 << 7) + 1,
	RS_WC_WITH_IMM = 1 << 1,

	RS_PORT_ACTIVE = 4,
	RS_LINK_LAYER_INFINIBAND = 1,
	RS_LINK_LAYER_ETHERNET = 2,

	RS_EVENT_CQ_ERR = 0,
	RS_EVENT_QP_FATAL = 1,
	RS_EVENT_QP_REQ_ERR = 2,
	RS_EVENT_QP_ACCESS_ERR = 3,
	RS_EVENT_DEVICE_FATAL = 8,
	RS_EVENT_PORT_ACTIVE = 9,
	RS_EVENT_PORT_ERR = 10,
};

// The loader and the calls rsock makes (shim.c). Functions returning int
// return 0 on success and an errno value on failure.
int rs_load(const char *name, char *err, size_t errlen);

struct rs_context *rs_open(const char *name, int *err);
int rs_close(struct rs_context *ctx);
int rs_query_port(struct rs_context *ctx, uint8_t port, union rs_port_buf *out);
int rs_query_device(struct rs_context *ctx, union rs_device_buf *out);
int rs_query_gid(struct rs_context *ctx, uint8_t port, int index, uint8_t gid[16]);
struct rs_pd *rs_alloc_pd(struct rs_context *ctx, int *err);
int rs_dealloc_pd(struct rs_pd *pd);
struct rs_mr *rs_reg_mr(struct rs_pd *pd, void *addr, size_t len, int access, int *err);
int rs_dereg_mr(struct rs_mr *mr);
struct rs_comp_channel *rs_create_channel(struct rs_context *ctx, int *err);
int rs_destroy_channel(struct rs_comp_channel *ch);
struct rs_cq *rs_create_cq(struct rs_context *ctx, int cqe, struct rs_comp_channel *ch, int vector, int *err);
int rs_destroy_cq(struct rs_cq *cq);
int rs_get_cq_event(struct rs_comp_channel *ch, struct rs_cq **cq);
void rs_ack_cq_events(struct rs_cq *cq, unsigned int n);
int rs_req_notify_cq(struct rs_cq *cq, int solicited_only);
int rs_poll_cq(struct rs_cq *cq, int n, struct rs_wc *wc);
struct rs_qp *rs_create_qp(struct rs_pd *pd, struct rs_cq *cq, struct rs_qp_cap *cap, int *err);
int rs_destroy_qp(struct rs_qp *qp);
int rs_qp_init(struct rs_qp *qp, uint8_t port, unsigned int access);
int rs_qp_rtr(struct rs_qp *qp, uint8_t port, uint32_t mtu, uint32_t dest_qpn, uint32_t rq_psn,
	      const uint8_t dgid[16], int is_global, uint8_t sgid_index, uint16_t dlid, uint8_t min_rnr_timer,
	      uint8_t traffic_class, uint8_t sl);
int rs_qp_rts(struct rs_qp *qp, uint32_t sq_psn, uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry);
int rs_qp_err(struct rs_qp *qp);
// rs_post is one send work request as Go hands it to rs_post_sends: plain
// values, no pointers (cgo may not be given Go memory that holds pointers).
// Inline data is at inl_off of the call's inline buffer.
struct rs_post {
	uint64_t wr_id;
	uint64_t laddr;
	uint64_t raddr;
	uint32_t opcode;
	uint32_t flags;
	uint32_t len;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t inl_off;
};

// RS_MAX_CHAIN is the most requests one rs_post_sends posts.
#define RS_MAX_CHAIN 8

int rs_post_sends(struct rs_qp *qp, const struct rs_post *p, int n, const uint8_t *inl, int *posted);
int rs_post_recv(struct rs_qp *qp, uint64_t wr_id, uint64_t laddr, uint32_t len, uint32_t lkey);
int rs_get_async_event(struct rs_context *ctx, struct rs_async_event *ev);
void rs_ack_async_event(struct rs_async_event *ev);
int rs_set_nonblock(int fd);
const char *rs_context_name(struct rs_context *ctx);
int rs_modify_qp(struct rs_qp *qp, struct rs_qp_attr *attr, int mask);
int rs_query_qp(struct rs_qp *qp, struct rs_qp_attr *attr);

// ---- librdmacm (cmshim.c): the connection manager, for devices whose QPs
// can only be connected through it (iWARP). Loaded with dlopen like
// libibverbs; layouts follow <rdma/rdma_cma.h> and are checked by
// abicheck.go.

#include <sys/socket.h>

// struct rdma_event_channel.
struct rs_cm_channel {
	int fd;
};

// struct rdma_cm_id, up to route.addr's two addresses.
struct rs_cm_id {
	struct rs_context *verbs;
	struct rs_cm_channel *channel;
	void *context;
	struct rs_qp *qp;
	struct sockaddr_storage src; // route.addr.src_storage
	struct sockaddr_storage dst; // route.addr.dst_storage
};

// struct rdma_conn_param.
struct rs_conn_param {
	const void *private_data;
	uint8_t private_data_len;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t flow_control;
	uint8_t retry_count;
	uint8_t rnr_retry_count;
	uint8_t srq;
	uint32_t qp_num;
};

// struct rdma_cm_event, up to param.conn (librdmacm allocates events;
// rsock only reads them).
struct rs_cm_event {
	struct rs_cm_id *id;
	struct rs_cm_id *listen_id;
	uint32_t event; // enum rdma_cm_event_type
	int status;
	union {
		struct rs_conn_param conn;
	} param;
};

enum {
	RS_PS_TCP = 0x0106,

	RS_CM_ADDR_RESOLVED = 0,
	RS_CM_ADDR_ERROR = 1,
	RS_CM_ROUTE_RESOLVED = 2,
	RS_CM_ROUTE_ERROR = 3,
	RS_CM_CONNECT_REQUEST = 4,
	RS_CM_CONNECT_RESPONSE = 5,
	RS_CM_CONNECT_ERROR = 6,
	RS_CM_UNREACHABLE = 7,
	RS_CM_REJECTED = 8,
	RS_CM_ESTABLISHED = 9,
	RS_CM_DISCONNECTED = 10,
	RS_CM_DEVICE_REMOVAL = 11,
	RS_CM_ADDR_CHANGE = 14,
	RS_CM_TIMEWAIT_EXIT = 15,
};

// struct ibv_path_data (<infiniband/sa.h>): a path record in the SA's
// wire format (struct ibv_path_record) and what it is for.
struct rs_path_data {
	uint32_t flags;
	uint32_t reserved;
	uint8_t path[64];
};

enum {
	RS_CM_OPTION_IB = 1,
	RS_CM_OPTION_IB_PATH = 1,
	RS_PATH_FLAGS = 1 | 2 | 8 | 32, // GMP, PRIMARY, BIDIRECTIONAL
};

// What rsock reads of an event, copied before the event is acknowledged.
struct rs_cm_got {
	struct rs_cm_id *id;
	struct rs_cm_id *listen_id;
	uint32_t event;
	int status;
	uint8_t pdata_len;
	uint8_t pdata[64];
};

int rs_cm_load(const char *name, char *err, size_t errlen);
struct rs_cm_channel *rs_cm_create_channel(int *err);
struct rs_cm_id *rs_cm_create_id(struct rs_cm_channel *ch, int *err);
int rs_cm_destroy_id(struct rs_cm_id *id);
int rs_cm_bind(struct rs_cm_id *id, const struct sockaddr *addr);
int rs_cm_listen(struct rs_cm_id *id, int backlog);
uint16_t rs_cm_src_port(struct rs_cm_id *id);
int rs_cm_resolve_addr(struct rs_cm_id *id, const struct sockaddr *src, const struct sockaddr *dst, int timeout_ms);
int rs_cm_resolve_route(struct rs_cm_id *id, int timeout_ms);
int rs_cm_set_tos(struct rs_cm_id *id, uint8_t tos);
int rs_cm_set_path(struct rs_cm_id *id, const uint8_t *rec);
int rs_cm_connect(struct rs_cm_id *id, uint32_t qpn, const void *pdata, uint8_t len);
int rs_cm_accept(struct rs_cm_id *id, uint32_t qpn);
int rs_cm_reject(struct rs_cm_id *id);
int rs_cm_disconnect(struct rs_cm_id *id);
int rs_cm_get_event(struct rs_cm_channel *ch, struct rs_cm_got *got);
const char *rs_cm_event_str(uint32_t event);
int rs_cm_qp_to(struct rs_cm_id *id, struct rs_qp *qp, uint32_t state, uint8_t port, int sl, uint8_t *sl_out, uint8_t timeout, uint8_t retry_cnt,
		uint8_t rnr_retry);
int rs_cm_establish(struct rs_cm_id *id);

#endif
