//go:build cgo && linux

// cmshim.c: loads librdmacm with dlopen and wraps the connection manager
// calls rsock makes for devices that need it (iWARP). Like shim.c, nothing
// links against the library: a host without it reports those devices
// unavailable with the reason, and nothing else changes.

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

struct cm_table {
	struct rs_cm_channel *(*create_event_channel)(void);
	int (*create_id)(struct rs_cm_channel *ch, struct rs_cm_id **id, void *context, int ps);
	int (*destroy_id)(struct rs_cm_id *id);
	int (*bind_addr)(struct rs_cm_id *id, const struct sockaddr *addr);
	int (*listen)(struct rs_cm_id *id, int backlog);
	uint16_t (*get_src_port)(struct rs_cm_id *id);
	int (*resolve_addr)(struct rs_cm_id *id, const struct sockaddr *src, const struct sockaddr *dst, int timeout_ms);
	int (*resolve_route)(struct rs_cm_id *id, int timeout_ms);
	int (*set_option)(struct rs_cm_id *id, int level, int optname, void *optval, size_t optlen);
	int (*connect)(struct rs_cm_id *id, struct rs_conn_param *param);
	int (*accept)(struct rs_cm_id *id, struct rs_conn_param *param);
	int (*reject)(struct rs_cm_id *id, const void *pdata, uint8_t len);
	int (*disconnect)(struct rs_cm_id *id);
	int (*get_cm_event)(struct rs_cm_channel *ch, struct rs_cm_event **ev);
	int (*ack_cm_event)(struct rs_cm_event *ev);
	const char *(*event_str)(uint32_t event);
	int (*init_qp_attr)(struct rs_cm_id *id, struct rs_qp_attr *attr, int *mask);
	int (*establish)(struct rs_cm_id *id);
};

// cm is set once, by a successful rs_cm_load, before any other call.
static struct cm_table cm;

int rs_cm_load(const char *name, char *err, size_t errlen)
{
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
	struct cm_table t;
	memset(&t, 0, sizeof(t));
#define CMSYM(field, sym)                                                   \
	do {                                                                \
		*(void **)(&t.field) = dlsym(h, sym);                      \
		if (t.field == NULL) {                                      \
			snprintf(err, errlen, "%s has no symbol %s", name, sym); \
			dlclose(h);                                         \
			return -1;                                          \
		}                                                           \
	} while (0)
	CMSYM(create_event_channel, "rdma_create_event_channel");
	CMSYM(create_id, "rdma_create_id");
	CMSYM(destroy_id, "rdma_destroy_id");
	CMSYM(bind_addr, "rdma_bind_addr");
	CMSYM(listen, "rdma_listen");
	CMSYM(get_src_port, "rdma_get_src_port");
	CMSYM(resolve_addr, "rdma_resolve_addr");
	CMSYM(resolve_route, "rdma_resolve_route");
	CMSYM(set_option, "rdma_set_option");
	CMSYM(connect, "rdma_connect");
	CMSYM(accept, "rdma_accept");
	CMSYM(reject, "rdma_reject");
	CMSYM(disconnect, "rdma_disconnect");
	CMSYM(get_cm_event, "rdma_get_cm_event");
	CMSYM(ack_cm_event, "rdma_ack_cm_event");
	CMSYM(event_str, "rdma_event_str");
	CMSYM(init_qp_attr, "rdma_init_qp_attr");
	CMSYM(establish, "rdma_establish");
#undef CMSYM
	cm = t;
	return 0;
}

// The calls below return 0 or an errno value (librdmacm returns -1 and
// sets errno).
static int cm_ret(int rc) { return rc == 0 ? 0 : (errno != 0 ? errno : EIO); }

struct rs_cm_channel *rs_cm_create_channel(int *err)
{
	errno = 0;
	struct rs_cm_channel *ch = cm.create_event_channel();
	*err = ch == NULL ? (errno != 0 ? errno : ENODEV) : 0;
	return ch;
}

struct rs_cm_id *rs_cm_create_id(struct rs_cm_channel *ch, int *err)
{
	struct rs_cm_id *id = NULL;
	errno = 0;
	*err = cm_ret(cm.create_id(ch, &id, NULL, RS_PS_TCP));
	return *err == 0 ? id : NULL;
}

int rs_cm_destroy_id(struct rs_cm_id *id)
{
	errno = 0;
	return cm_ret(cm.destroy_id(id));
}

int rs_cm_bind(struct rs_cm_id *id, const struct sockaddr *addr)
{
	errno = 0;
	return cm_ret(cm.bind_addr(id, addr));
}

int rs_cm_listen(struct rs_cm_id *id, int backlog)
{
	errno = 0;
	return cm_ret(cm.listen(id, backlog));
}

// rs_cm_src_port is the bound port in host byte order.
uint16_t rs_cm_src_port(struct rs_cm_id *id)
{
	uint16_t be = cm.get_src_port(id);
	return (uint16_t)((be >> 8) | (be << 8));
}

int rs_cm_resolve_addr(struct rs_cm_id *id, const struct sockaddr *src, const struct sockaddr *dst, int timeout_ms)
{
	errno = 0;
	return cm_ret(cm.resolve_addr(id, src, dst, timeout_ms));
}

int rs_cm_resolve_route(struct rs_cm_id *id, int timeout_ms)
{
	errno = 0;
	return cm_ret(cm.resolve_route(id, timeout_ms));
}

// rs_cm_set_tos sets the identifier's IP type of service (RDMA_OPTION_ID,
// RDMA_OPTION_ID_TOS), which replaces the port's default_roce_tos.
int rs_cm_set_tos(struct rs_cm_id *id, uint8_t tos)
{
	errno = 0;
	return cm_ret(cm.set_option(id, 0, 0, &tos, sizeof(tos)));
}

// rs_cm_set_path gives id, its address resolved, the path to connect on
// in place of rdma_resolve_route (RDMA_OPTION_IB_PATH, as ibacm supplies
// paths): rec is a path record in the SA's wire format, 64 bytes. The
// kernel answers with RDMA_CM_EVENT_ROUTE_RESOLVED.
int rs_cm_set_path(struct rs_cm_id *id, const uint8_t *rec)
{
	struct rs_path_data d;
	memset(&d, 0, sizeof(d));
	d.flags = RS_PATH_FLAGS;
	memcpy(d.path, rec, sizeof(d.path));
	errno = 0;
	return cm_ret(cm.set_option(id, RS_CM_OPTION_IB, RS_CM_OPTION_IB_PATH, &d, sizeof(d)));
}

// Both ends ask for one outstanding RDMA READ each way (rsock posts none)
// and finite retries, as the QPs connected without rdma_cm do.
static void conn_param(struct rs_conn_param *p, uint32_t qpn)
{
	memset(p, 0, sizeof(*p));
	p->responder_resources = 1;
	p->initiator_depth = 1;
	p->retry_count = 6;
	p->rnr_retry_count = 6;
	p->qp_num = qpn;
}

int rs_cm_connect(struct rs_cm_id *id, uint32_t qpn, const void *pdata, uint8_t len)
{
	struct rs_conn_param p;
	conn_param(&p, qpn);
	p.private_data = pdata;
	p.private_data_len = len;
	errno = 0;
	return cm_ret(cm.connect(id, &p));
}

int rs_cm_accept(struct rs_cm_id *id, uint32_t qpn)
{
	struct rs_conn_param p;
	conn_param(&p, qpn);
	errno = 0;
	return cm_ret(cm.accept(id, &p));
}

int rs_cm_reject(struct rs_cm_id *id)
{
	errno = 0;
	return cm_ret(cm.reject(id, NULL, 0));
}

int rs_cm_disconnect(struct rs_cm_id *id)
{
	errno = 0;
	return cm_ret(cm.disconnect(id));
}

// rs_cm_get_event reads one event from a non-blocking channel into got and
// acknowledges it: 0, EAGAIN when there is none, or another errno. A
// CONNECT_REQUEST's private data is copied (at most sizeof got->pdata).
int rs_cm_get_event(struct rs_cm_channel *ch, struct rs_cm_got *got)
{
	struct rs_cm_event *ev = NULL;
	errno = 0;
	if (cm.get_cm_event(ch, &ev) != 0)
		return errno != 0 ? errno : EIO;
	memset(got, 0, sizeof(*got));
	got->id = ev->id;
	got->listen_id = ev->listen_id;
	got->event = ev->event;
	got->status = ev->status;
	if (ev->event == RS_CM_CONNECT_REQUEST && ev->param.conn.private_data != NULL) {
		uint8_t n = ev->param.conn.private_data_len;
		if (n > sizeof(got->pdata))
			n = sizeof(got->pdata);
		memcpy(got->pdata, ev->param.conn.private_data, n);
		got->pdata_len = n;
	}
	cm.ack_cm_event(ev);
	return 0;
}

const char *rs_cm_event_str(uint32_t event) { return cm.event_str(event); }

// rs_cm_qp_to moves qp (created by rsock, not by rdma_cm) to state with the
// attributes rdma_cm derives for id from its route and the peer's request
// or reply. On INIT (from INIT): the path's partition (pkey index), if the
// path is on qp's port (else EXDEV), with rsock's own access rights
// (remote write, never remote read, whatever the CM would grant). On RTR:
// the path's GRH and addresses, and its SL unless sl (the configured one)
// is 0-15; the SL given goes to *sl_out. On RTS: rsock's finite retry
// limits.
int rs_cm_qp_to(struct rs_cm_id *id, struct rs_qp *qp, uint32_t state, uint8_t port, int sl, uint8_t *sl_out, uint8_t timeout, uint8_t retry_cnt,
		uint8_t rnr_retry)
{
	struct rs_qp_attr a;
	int mask = 0;
	memset(&a, 0, sizeof(a));
	a.qp_state = state;
	errno = 0;
	if (cm.init_qp_attr(id, &a, &mask) != 0)
		return errno != 0 ? errno : EIO;
	if (state == RS_QPS_INIT) {
		if ((mask & RS_QP_PORT) && a.port_num != port)
			return EXDEV; // a path on another port than the QP's
		a.qp_access_flags = RS_ACCESS_LOCAL_WRITE | RS_ACCESS_REMOTE_WRITE;
		mask |= RS_QP_ACCESS_FLAGS;
	}
	if (state == RS_QPS_RTR) {
		if (sl >= 0)
			a.ah_attr.sl = (uint8_t)sl;
		*sl_out = a.ah_attr.sl;
	}
	if (state == RS_QPS_RTS) {
		a.timeout = timeout;
		a.retry_cnt = retry_cnt;
		a.rnr_retry = rnr_retry;
		mask |= RS_QP_TIMEOUT | RS_QP_RETRY_CNT | RS_QP_RNR_RETRY;
	}
	return rs_modify_qp(qp, &a, mask);
}

int rs_cm_establish(struct rs_cm_id *id)
{
	errno = 0;
	return cm_ret(cm.establish(id));
}
