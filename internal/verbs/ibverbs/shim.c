//go:build cgo && linux

// shim.c: loads libibverbs with dlopen and wraps the calls rsock makes.
// Nothing here links against libibverbs, so a binary built with this file
// starts on a host without it; verbs is then reported unavailable.

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>

#include "shim.h"

struct ibv_table {
	struct rs_device **(*get_device_list)(int *num);
	void (*free_device_list)(struct rs_device **list);
	const char *(*get_device_name)(struct rs_device *dev);
	struct rs_context *(*open_device)(struct rs_device *dev);
	int (*close_device)(struct rs_context *ctx);
	int (*query_port)(struct rs_context *ctx, uint8_t port, void *attr);
	int (*query_device)(struct rs_context *ctx, void *attr);
	int (*query_gid)(struct rs_context *ctx, uint8_t port, int index, void *gid);
	struct rs_pd *(*alloc_pd)(struct rs_context *ctx);
	int (*dealloc_pd)(struct rs_pd *pd);
	struct rs_mr *(*reg_mr)(struct rs_pd *pd, void *addr, size_t len, int access);
	int (*dereg_mr)(struct rs_mr *mr);
	struct rs_comp_channel *(*create_comp_channel)(struct rs_context *ctx);
	int (*destroy_comp_channel)(struct rs_comp_channel *ch);
	struct rs_cq *(*create_cq)(struct rs_context *ctx, int cqe, void *cq_context,
				   struct rs_comp_channel *ch, int comp_vector);
	int (*destroy_cq)(struct rs_cq *cq);
	int (*get_cq_event)(struct rs_comp_channel *ch, struct rs_cq **cq, void **cq_context);
	void (*ack_cq_events)(struct rs_cq *cq, unsigned int n);
	struct rs_qp *(*create_qp)(struct rs_pd *pd, struct rs_qp_init_attr *attr);
	int (*modify_qp)(struct rs_qp *qp, struct rs_qp_attr *attr, int mask);
	int (*query_qp)(struct rs_qp *qp, struct rs_qp_attr *attr, int mask, struct rs_qp_init_attr *init);
	int (*destroy_qp)(struct rs_qp *qp);
	int (*get_async_event)(struct rs_context *ctx, struct rs_async_event *ev);
	void (*ack_async_event)(struct rs_async_event *ev);
	int (*fork_init)(void);
};

// ibv is set once, by a successful rs_load, before any other call.
static struct ibv_table ibv;

#define SYM(field, sym, required)                                                  \
	do {                                                                        \
		*(void **)(&t.field) = dlsym(h, sym);                            \
		if (required && t.field == NULL) {                                \
			snprintf(err, errlen, "%s has no symbol %s", name, sym);   \
			dlclose(h);                                                 \
			return -1;                                                  \
		}                                                                   \
	} while (0)

int rs_load(const char *name, char *err, size_t errlen)
{
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
	// Resolved into t and published only when complete: a failed load
	// leaves ibv as it was.
	struct ibv_table t;
	memset(&t, 0, sizeof(t));
	SYM(get_device_list, "ibv_get_device_list", 1);
	SYM(free_device_list, "ibv_free_device_list", 1);
	SYM(get_device_name, "ibv_get_device_name", 1);
	SYM(open_device, "ibv_open_device", 1);
	SYM(close_device, "ibv_close_device", 1);
	SYM(query_port, "ibv_query_port", 1);
	SYM(query_device, "ibv_query_device", 1);
	SYM(query_gid, "ibv_query_gid", 1);
	SYM(alloc_pd, "ibv_alloc_pd", 1);
	SYM(dealloc_pd, "ibv_dealloc_pd", 1);
	SYM(reg_mr, "ibv_reg_mr", 1);
	SYM(dereg_mr, "ibv_dereg_mr", 1);
	SYM(create_comp_channel, "ibv_create_comp_channel", 1);
	SYM(destroy_comp_channel, "ibv_destroy_comp_channel", 1);
	SYM(create_cq, "ibv_create_cq", 1);
	SYM(destroy_cq, "ibv_destroy_cq", 1);
	SYM(get_cq_event, "ibv_get_cq_event", 1);
	SYM(ack_cq_events, "ibv_ack_cq_events", 1);
	SYM(create_qp, "ibv_create_qp", 1);
	SYM(modify_qp, "ibv_modify_qp", 1);
	SYM(query_qp, "ibv_query_qp", 1);
	SYM(destroy_qp, "ibv_destroy_qp", 1);
	SYM(get_async_event, "ibv_get_async_event", 1);
	SYM(ack_async_event, "ibv_ack_async_event", 1);
	SYM(fork_init, "ibv_fork_init", 0);
	// Registered memory must stay correct across fork: rsock marks its
	// own regions MADV_DONTFORK; ibv_fork_init covers the provider's
	// queues on kernels that need it (it is a no-op where the kernel
	// handles pinned pages across fork, 5.13 and later).
	ibv = t;
	if (ibv.fork_init != NULL)
		(void)ibv.fork_init();
	return 0;
}

// errno_or: the errno a failed call left, or fallback if it left none.
static int errno_or(int fallback)
{
	return errno != 0 ? errno : fallback;
}

struct rs_context *rs_open(const char *name, int *err)
{
	int n = 0;
	struct rs_context *ctx = NULL;
	errno = 0;
	struct rs_device **list = ibv.get_device_list(&n);
	if (list == NULL) {
		*err = errno_or(ENODEV);
		return NULL;
	}
	*err = ENODEV;
	for (int i = 0; i < n; i++) {
		const char *dn = ibv.get_device_name(list[i]);
		if (dn != NULL && strcmp(dn, name) == 0) {
			errno = 0;
			ctx = ibv.open_device(list[i]);
			*err = ctx ? 0 : errno_or(EIO);
			break;
		}
	}
	ibv.free_device_list(list);
	return ctx;
}

int rs_close(struct rs_context *ctx) { return ibv.close_device(ctx); }

int rs_query_port(struct rs_context *ctx, uint8_t port, union rs_port_buf *out)
{
	memset(out, 0, sizeof(*out));
	return ibv.query_port(ctx, port, out);
}

int rs_query_device(struct rs_context *ctx, union rs_device_buf *out)
{
	memset(out, 0, sizeof(*out));
	errno = 0;
	int r = ibv.query_device(ctx, out);
	return r == 0 ? 0 : (r > 0 ? r : errno_or(EIO));
}

int rs_query_gid(struct rs_context *ctx, uint8_t port, int index, uint8_t gid[16])
{
	errno = 0;
	return ibv.query_gid(ctx, port, index, gid) == 0 ? 0 : errno_or(EINVAL);
}

struct rs_pd *rs_alloc_pd(struct rs_context *ctx, int *err)
{
	errno = 0;
	struct rs_pd *pd = ibv.alloc_pd(ctx);
	*err = pd ? 0 : errno_or(ENOMEM);
	return pd;
}

int rs_dealloc_pd(struct rs_pd *pd) { return ibv.dealloc_pd(pd); }

struct rs_mr *rs_reg_mr(struct rs_pd *pd, void *addr, size_t len, int access, int *err)
{
	errno = 0;
	struct rs_mr *mr = ibv.reg_mr(pd, addr, len, access);
	*err = mr ? 0 : errno_or(ENOMEM);
	return mr;
}

int rs_dereg_mr(struct rs_mr *mr) { return ibv.dereg_mr(mr); }

struct rs_comp_channel *rs_create_channel(struct rs_context *ctx, int *err)
{
	errno = 0;
	struct rs_comp_channel *ch = ibv.create_comp_channel(ctx);
	*err = ch ? 0 : errno_or(ENOMEM);
	return ch;
}

int rs_destroy_channel(struct rs_comp_channel *ch) { return ibv.destroy_comp_channel(ch); }

struct rs_cq *rs_create_cq(struct rs_context *ctx, int cqe, struct rs_comp_channel *ch, int vector, int *err)
{
	errno = 0;
	struct rs_cq *cq = ibv.create_cq(ctx, cqe, NULL, ch, vector);
	*err = cq ? 0 : errno_or(ENOMEM);
	return cq;
}

int rs_destroy_cq(struct rs_cq *cq) { return ibv.destroy_cq(cq); }

// rs_get_cq_event reads one event from a non-blocking channel into *cq: 0,
// or EAGAIN when there is none, or another errno.
int rs_get_cq_event(struct rs_comp_channel *ch, struct rs_cq **cq)
{
	void *cq_context;
	errno = 0;
	if (ibv.get_cq_event(ch, cq, &cq_context) == 0)
		return 0;
	return errno_or(EIO);
}

void rs_ack_cq_events(struct rs_cq *cq, unsigned int n) { ibv.ack_cq_events(cq, n); }

int rs_req_notify_cq(struct rs_cq *cq, int solicited_only)
{
	return cq->context->ops.req_notify_cq(cq, solicited_only);
}

// rs_poll_cq returns the number of completions (>= 0) or a negative value
// on error, as ibv_poll_cq does.
int rs_poll_cq(struct rs_cq *cq, int n, struct rs_wc *wc) { return cq->context->ops.poll_cq(cq, n, wc); }

struct rs_qp *rs_create_qp(struct rs_pd *pd, struct rs_cq *cq, struct rs_qp_cap *cap, int *err)
{
	struct rs_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.cap = *cap;
	a.qp_type = RS_QPT_RC;
	a.sq_sig_all = 0;
	errno = 0;
	struct rs_qp *qp = ibv.create_qp(pd, &a);
	if (qp == NULL) {
		*err = errno_or(ENOMEM);
		return NULL;
	}
	*cap = a.cap; // what the device granted
	*err = 0;
	return qp;
}

int rs_destroy_qp(struct rs_qp *qp) { return ibv.destroy_qp(qp); }

int rs_qp_init(struct rs_qp *qp, uint8_t port, unsigned int access)
{
	struct rs_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = RS_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = access;
	return ibv.modify_qp(qp, &a, RS_QP_STATE | RS_QP_PKEY_INDEX | RS_QP_PORT | RS_QP_ACCESS_FLAGS);
}

int rs_qp_rtr(struct rs_qp *qp, uint8_t port, uint32_t mtu, uint32_t dest_qpn, uint32_t rq_psn,
	      const uint8_t dgid[16], int is_global, uint8_t sgid_index, uint16_t dlid, uint8_t min_rnr_timer,
	      uint8_t traffic_class, uint8_t sl)
{
	struct rs_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = RS_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = min_rnr_timer;
	a.ah_attr.port_num = port;
	a.ah_attr.dlid = dlid;
	a.ah_attr.sl = sl;
	if (is_global) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
		a.ah_attr.grh.sgid_index = sgid_index;
		a.ah_attr.grh.hop_limit = 64;
		a.ah_attr.grh.traffic_class = traffic_class; // RoCE v2: the IP header's DS field
	}
	return ibv.modify_qp(qp, &a,
			     RS_QP_STATE | RS_QP_AV | RS_QP_PATH_MTU | RS_QP_DEST_QPN | RS_QP_RQ_PSN |
				     RS_QP_MAX_DEST_RD_ATOMIC | RS_QP_MIN_RNR_TIMER);
}

int rs_qp_rts(struct rs_qp *qp, uint32_t sq_psn, uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry)
{
	struct rs_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = RS_QPS_RTS;
	a.sq_psn = sq_psn;
	a.timeout = timeout;
	a.retry_cnt = retry_cnt;
	a.rnr_retry = rnr_retry;
	a.max_rd_atomic = 1;
	return ibv.modify_qp(qp, &a,
			     RS_QP_STATE | RS_QP_SQ_PSN | RS_QP_TIMEOUT | RS_QP_RETRY_CNT | RS_QP_RNR_RETRY |
				     RS_QP_MAX_QP_RD_ATOMIC);
}

int rs_qp_err(struct rs_qp *qp)
{
	struct rs_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = RS_QPS_ERR;
	return ibv.modify_qp(qp, &a, RS_QP_STATE);
}

int rs_post_sends(struct rs_qp *qp, const struct rs_post *p, int n, const uint8_t *inl, int *posted)
{
	// One ibv_post_send for the whole chain: one lock in the provider, one
	// doorbell. Inline data is read by the provider before it returns.
	struct rs_sge sge[RS_MAX_CHAIN];
	struct rs_send_wr wr[RS_MAX_CHAIN], *bad = NULL;
	int i, e;
	*posted = 0;
	if (n < 1 || n > RS_MAX_CHAIN)
		return EINVAL;
	memset(wr, 0, sizeof(wr[0]) * n);
	for (i = 0; i < n; i++) {
		sge[i].addr = (p[i].flags & RS_SEND_INLINE) ? (uint64_t)(uintptr_t)(inl + p[i].inl_off) : p[i].laddr;
		sge[i].length = p[i].len;
		sge[i].lkey = p[i].lkey;
		wr[i].wr_id = p[i].wr_id;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = p[i].len > 0 ? 1 : 0;
		wr[i].opcode = p[i].opcode;
		wr[i].send_flags = p[i].flags;
		wr[i].wr.rdma.remote_addr = p[i].raddr;
		wr[i].wr.rdma.rkey = p[i].rkey;
	}
	e = qp->context->ops.post_send(qp, wr, &bad);
	// A failure without a bad request named counts as none posted; if some
	// were, their completions retire past sqHead, and the QP, failed
	// anyway, then refuses posts as full.
	*posted = e == 0 ? n : (bad >= wr && bad < wr + n ? (int)(bad - wr) : 0);
	return e;
}

int rs_post_recv(struct rs_qp *qp, uint64_t wr_id, uint64_t laddr, uint32_t len, uint32_t lkey)
{
	struct rs_sge sge = {.addr = laddr, .length = len, .lkey = lkey};
	struct rs_recv_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = len > 0 ? 1 : 0;
	return qp->context->ops.post_recv(qp, &wr, &bad);
}

int rs_get_async_event(struct rs_context *ctx, struct rs_async_event *ev)
{
	errno = 0;
	if (ibv.get_async_event(ctx, ev) == 0)
		return 0;
	return errno_or(EIO);
}

void rs_ack_async_event(struct rs_async_event *ev) { ibv.ack_async_event(ev); }

const char *rs_context_name(struct rs_context *ctx) { return ibv.get_device_name(ctx->device); }

int rs_modify_qp(struct rs_qp *qp, struct rs_qp_attr *attr, int mask) { return ibv.modify_qp(qp, attr, mask); }

int rs_query_qp(struct rs_qp *qp, struct rs_qp_attr *attr)
{
	struct rs_qp_init_attr init;
	memset(attr, 0, sizeof(*attr));
	memset(&init, 0, sizeof(init));
	return ibv.query_qp(qp, attr,
			    RS_QP_STATE | RS_QP_ACCESS_FLAGS | RS_QP_PKEY_INDEX | RS_QP_PORT | RS_QP_AV | RS_QP_TIMEOUT |
				    RS_QP_RETRY_CNT | RS_QP_RNR_RETRY | RS_QP_MAX_QP_RD_ATOMIC | RS_QP_MAX_DEST_RD_ATOMIC,
			    &init);
}

// rs_set_nonblock makes fd non-blocking and closed on exec: the event
// descriptors of a context must not leak into the programs a process runs.
int rs_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return errno_or(EIO);
	int fd_fl = fcntl(fd, F_GETFD);
	if (fd_fl < 0 || fcntl(fd, F_SETFD, fd_fl | FD_CLOEXEC) < 0)
		return errno_or(EIO);
	return 0;
}
