//go:build softroce

// Command softroce-probe checks, through libibverbs and cgo, that a verbs
// device gives a Go program what the rsock verbs provider needs: it opens the
// device (ibv_get_device_list, ibv_open_device), queries it and its port
// (state, active MTU, the GID at the given index), allocates a PD, registers
// a 1 MiB MR with remote write, creates a CQ with a completion channel and an
// RC QP, and moves the QP to INIT. With -write it also connects a second RC
// QP to the first over the GID (loopback on the one device), RDMA WRITEs half
// of the MR onto the other half, waits for the completion through the
// channel and checks the bytes.
//
// It prints what it finds and exits 0 only if every step worked.
//
// test/softroce/run.sh builds it on the host (CGO_ENABLED=1, -tags softroce,
// libibverbs-dev) and runs it in the Soft-RoCE guest. The build tag keeps this
// cgo package out of `go vet ./...` and `go test ./...` on machines without
// libibverbs-dev.
package main

/*
#cgo LDFLAGS: -libverbs
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

// ibv_query_port and ibv_reg_mr are macros or inline wrappers in rdma-core's
// verbs.h, which cgo cannot call: wrap them, and everything that fills the
// unions and nested structs of the verbs API.

static uint64_t pr_be64(__be64 v) { return be64toh(v); }

static int pr_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
	memset(attr, 0, sizeof(*attr));
	return ibv_query_port(ctx, port, attr);
}

static struct ibv_mr *pr_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
	return ibv_reg_mr(pd, addr, len, access);
}

static void *pr_alloc(size_t align, size_t len) {
	void *p = NULL;
	if (posix_memalign(&p, align, len) != 0)
		return NULL;
	memset(p, 0, len);
	return p;
}

static struct ibv_qp *pr_create_rc_qp(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t depth) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = depth;
	a.cap.max_recv_wr = depth;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	return ibv_create_qp(pd, &a);
}

static int pr_qp_init(struct ibv_qp *qp, uint8_t port, int access) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = access;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int pr_qp_rtr(struct ibv_qp *qp, uint8_t port, int sgid_index, const union ibv_gid *dgid,
		     uint32_t dest_qpn, uint32_t rq_psn, enum ibv_mtu mtu) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.sgid_index = sgid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = port;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int pr_qp_rts(struct ibv_qp *qp, uint32_t sq_psn) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = sq_psn;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int pr_post_write(struct ibv_qp *qp, void *laddr, uint32_t len, uint32_t lkey,
			 uint64_t raddr, uint32_t rkey, uint64_t wr_id) {
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad = NULL;
	sge.addr = (uintptr_t)laddr;
	sge.length = len;
	sge.lkey = lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

static long pr_ms_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// pr_wait_one waits at most timeout_ms for one completion on cq, sleeping on
// the completion channel between polls. 0: *wc filled; -2: timed out;
// otherwise -1 with errno set.
static int pr_wait_one(struct ibv_comp_channel *ch, struct ibv_cq *cq, int timeout_ms,
		       struct ibv_wc *wc) {
	long deadline = pr_ms_now() + timeout_ms;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n == 1 ? 0 : -1;
		if (ibv_req_notify_cq(cq, 0) != 0)
			return -1;
		// A completion that arrived before the CQ was armed raises no event.
		n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n == 1 ? 0 : -1;
		long left = deadline - pr_ms_now();
		if (left <= 0)
			return -2;
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		int r = poll(&p, 1, (int)left);
		if (r < 0 && errno == EINTR)
			continue; // the Go runtime's signals
		if (r < 0)
			return -1;
		if (r == 0)
			return -2;
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) != 0)
			return -1;
		ibv_ack_cq_events(ev_cq, 1);
	}
}
*/
import "C"

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

const mrSize = 1 << 20

func main() {
	devName := flag.String("dev", envOr("SOFTROCE_DEV", "rxe0"), "verbs device name")
	port := flag.Int("port", 1, "port number")
	gidIndex := flag.Int("gid-index", 1, "GID index (1: the IPv4-mapped RoCE v2 GID on rxe)")
	write := flag.Bool("write", false, "also RDMA WRITE between two connected RC QPs and check the bytes")
	flag.Parse()

	p := &probe{port: *port, gidIndex: *gidIndex}
	err := p.run(*devName, *write)
	if cerr := p.close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Printf("probe: FAIL: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("probe: OK")
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// probe holds the verbs objects, for close to free in reverse order.
type probe struct {
	port, gidIndex int

	devs **C.struct_ibv_device
	ctx  *C.struct_ibv_context
	pd   *C.struct_ibv_pd
	buf  unsafe.Pointer
	mr   *C.struct_ibv_mr
	ch   *C.struct_ibv_comp_channel
	cq   *C.struct_ibv_cq
	qps  []*C.struct_ibv_qp
}

// errnoErr reports a verbs call that failed: the functions returning a
// pointer set errno, those returning int return it (or -1 and set errno).
func errnoErr(what string, ret C.int, err error) error {
	if ret > 0 {
		return fmt.Errorf("%s: %w", what, syscall.Errno(ret))
	}
	if err == nil {
		err = errors.New("failed, errno not set")
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (p *probe) run(devName string, write bool) error {
	var n C.int
	devs, err := C.ibv_get_device_list(&n)
	if devs == nil {
		return fmt.Errorf("ibv_get_device_list: %v", err)
	}
	p.devs = devs
	var dev *C.struct_ibv_device
	var names []string
	for _, d := range unsafe.Slice(devs, int(n)) {
		name := C.GoString(C.ibv_get_device_name(d))
		names = append(names, name)
		if name == devName {
			dev = d
		}
	}
	fmt.Printf("devices: %d [%s]\n", n, strings.Join(names, " "))
	if dev == nil {
		return fmt.Errorf("no device %q", devName)
	}

	ctx, err := C.ibv_open_device(dev)
	if ctx == nil {
		return errnoErr("ibv_open_device "+devName, 0, err)
	}
	p.ctx = ctx

	var da C.struct_ibv_device_attr
	if ret, err := C.ibv_query_device(ctx, &da); ret != 0 {
		return errnoErr("ibv_query_device", ret, err)
	}
	fmt.Printf("device %s: fw %q, node guid %016x, ports %d, max_qp %d, max_cq %d, max_mr %d, max_mr_size %d, max_qp_wr %d, max_sge %d\n",
		devName, C.GoString(&da.fw_ver[0]), uint64(C.pr_be64(da.node_guid)), da.phys_port_cnt,
		da.max_qp, da.max_cq, da.max_mr, uint64(da.max_mr_size), da.max_qp_wr, da.max_sge)

	var pa C.struct_ibv_port_attr
	if ret, err := C.pr_query_port(ctx, C.uint8_t(p.port), &pa); ret != 0 {
		return errnoErr("ibv_query_port", ret, err)
	}
	fmt.Printf("port %d: state %s, active_mtu %d, max_mtu %d, link_layer %s, gid_tbl_len %d\n",
		p.port, C.GoString(C.ibv_port_state_str(pa.state)), mtuBytes(pa.active_mtu), mtuBytes(pa.max_mtu),
		linkLayer(pa.link_layer), pa.gid_tbl_len)
	if pa.state != C.IBV_PORT_ACTIVE {
		return fmt.Errorf("port %d is not active", p.port)
	}
	if mtuBytes(pa.active_mtu) == 0 {
		return fmt.Errorf("port %d: unknown active_mtu %d", p.port, pa.active_mtu)
	}

	var gid C.union_ibv_gid
	if ret, err := C.ibv_query_gid(ctx, C.uint8_t(p.port), C.int(p.gidIndex), &gid); ret != 0 {
		return errnoErr("ibv_query_gid", ret, err)
	}
	raw := C.GoBytes(unsafe.Pointer(&gid), 16)
	ip := net.IP(raw)
	fmt.Printf("gid[%d]: %s (%s, IPv4-mapped %v)\n", p.gidIndex, hexGID(raw), ip, ip.To4() != nil)
	if bytes.Equal(raw, make([]byte, 16)) {
		return fmt.Errorf("gid[%d] is zero", p.gidIndex)
	}

	pd, err := C.ibv_alloc_pd(ctx)
	if pd == nil {
		return errnoErr("ibv_alloc_pd", 0, err)
	}
	p.pd = pd
	fmt.Printf("pd: ok (handle %d)\n", pd.handle)

	// Memory handed to the device must not move: C memory, never Go's.
	p.buf = C.pr_alloc(4096, mrSize)
	if p.buf == nil {
		return errors.New("posix_memalign 1 MiB failed")
	}
	access := C.IBV_ACCESS_LOCAL_WRITE | C.IBV_ACCESS_REMOTE_WRITE | C.IBV_ACCESS_REMOTE_READ
	mr, err := C.pr_reg_mr(pd, p.buf, mrSize, C.int(access))
	if mr == nil {
		return errnoErr("ibv_reg_mr 1 MiB, remote write", 0, err)
	}
	p.mr = mr
	fmt.Printf("mr: %d bytes at %#x, lkey %#x, rkey %#x, access local_write|remote_write|remote_read\n",
		mr.length, uintptr(mr.addr), mr.lkey, mr.rkey)

	ch, err := C.ibv_create_comp_channel(ctx)
	if ch == nil {
		return errnoErr("ibv_create_comp_channel", 0, err)
	}
	p.ch = ch
	cq, err := C.ibv_create_cq(ctx, 64, nil, ch, 0)
	if cq == nil {
		return errnoErr("ibv_create_cq", 0, err)
	}
	p.cq = cq
	fmt.Printf("cq: %d entries, completion channel fd %d\n", cq.cqe, ch.fd)

	qa, err := p.newQP(access)
	if err != nil {
		return err
	}
	if !write {
		return nil
	}

	// A second QP, the two connected to each other through the GID: RC
	// loopback on one device, the path a two-host connection takes on rxe.
	qb, err := p.newQP(access)
	if err != nil {
		return err
	}
	for _, c := range []struct {
		qp     *C.struct_ibv_qp
		remote C.uint32_t
	}{{qa, qb.qp_num}, {qb, qa.qp_num}} {
		if ret, err := C.pr_qp_rtr(c.qp, C.uint8_t(p.port), C.int(p.gidIndex), &gid, c.remote, 0, pa.active_mtu); ret != 0 {
			return errnoErr(fmt.Sprintf("qp %d to RTR", c.qp.qp_num), ret, err)
		}
		if ret, err := C.pr_qp_rts(c.qp, 0); ret != 0 {
			return errnoErr(fmt.Sprintf("qp %d to RTS", c.qp.qp_num), ret, err)
		}
	}
	fmt.Printf("qp %d <-> qp %d: RTS, path_mtu %d\n", qa.qp_num, qb.qp_num, mtuBytes(pa.active_mtu))

	const half = mrSize / 2
	mem := unsafe.Slice((*byte)(p.buf), mrSize)
	for i := range half {
		mem[i] = byte(i*7 + i>>8 + 1)
	}
	clear(mem[half:])
	start := time.Now()
	if ret, err := C.pr_post_write(qa, p.buf, half, mr.lkey, C.uint64_t(uintptr(p.buf)+half), mr.rkey, 42); ret != 0 {
		return errnoErr("ibv_post_send RDMA WRITE", ret, err)
	}
	var wc C.struct_ibv_wc
	switch ret, err := C.pr_wait_one(ch, cq, 10000, &wc); ret {
	case 0:
	case -2:
		return errors.New("no completion for the RDMA WRITE within 10s")
	default:
		return errnoErr("waiting for the completion", 0, err)
	}
	took := time.Since(start)
	if wc.status != C.IBV_WC_SUCCESS || wc.opcode != C.IBV_WC_RDMA_WRITE || wc.wr_id != 42 {
		return fmt.Errorf("completion: status %s, opcode %d, wr_id %d",
			C.GoString(C.ibv_wc_status_str(wc.status)), wc.opcode, wc.wr_id)
	}
	if !bytes.Equal(mem[:half], mem[half:]) {
		return errors.New("RDMA WRITE completed but the destination bytes differ")
	}
	fmt.Printf("rdma write: %d bytes qp %d -> qp %d, completion via channel, bytes match, %v (%.0f MB/s)\n",
		half, qa.qp_num, qb.qp_num, took.Round(time.Microsecond), float64(half)/took.Seconds()/1e6)
	return nil
}

func (p *probe) newQP(access int) (*C.struct_ibv_qp, error) {
	qp, err := C.pr_create_rc_qp(p.pd, p.cq, 16)
	if qp == nil {
		return nil, errnoErr("ibv_create_qp RC", 0, err)
	}
	p.qps = append(p.qps, qp)
	if ret, err := C.pr_qp_init(qp, C.uint8_t(p.port), C.int(access)); ret != 0 {
		return nil, errnoErr(fmt.Sprintf("qp %d to INIT", qp.qp_num), ret, err)
	}
	fmt.Printf("qp: RC, qp_num %d, state INIT\n", qp.qp_num)
	return qp, nil
}

// close frees everything in reverse order and reports the first failure.
func (p *probe) close() error {
	var errs []error
	check := func(what string, ret C.int) {
		if ret != 0 {
			errs = append(errs, errnoErr(what, ret, nil))
		}
	}
	for i := len(p.qps) - 1; i >= 0; i-- {
		check("ibv_destroy_qp", C.ibv_destroy_qp(p.qps[i]))
	}
	if p.cq != nil {
		check("ibv_destroy_cq", C.ibv_destroy_cq(p.cq))
	}
	if p.ch != nil {
		check("ibv_destroy_comp_channel", C.ibv_destroy_comp_channel(p.ch))
	}
	if p.mr != nil {
		check("ibv_dereg_mr", C.ibv_dereg_mr(p.mr))
	}
	if p.buf != nil {
		C.free(p.buf)
	}
	if p.pd != nil {
		check("ibv_dealloc_pd", C.ibv_dealloc_pd(p.pd))
	}
	if p.ctx != nil {
		check("ibv_close_device", C.ibv_close_device(p.ctx))
	}
	if p.devs != nil {
		C.ibv_free_device_list(p.devs)
	}
	return errors.Join(errs...)
}

func mtuBytes(m C.enum_ibv_mtu) int {
	switch m {
	case C.IBV_MTU_256:
		return 256
	case C.IBV_MTU_512:
		return 512
	case C.IBV_MTU_1024:
		return 1024
	case C.IBV_MTU_2048:
		return 2048
	case C.IBV_MTU_4096:
		return 4096
	}
	return 0
}

func linkLayer(l C.uint8_t) string {
	switch l {
	case C.IBV_LINK_LAYER_ETHERNET:
		return "Ethernet"
	case C.IBV_LINK_LAYER_INFINIBAND:
		return "InfiniBand"
	}
	return fmt.Sprintf("unspecified(%d)", l)
}

func hexGID(b []byte) string {
	var s strings.Builder
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			s.WriteByte(':')
		}
		fmt.Fprintf(&s, "%02x%02x", b[i], b[i+1])
	}
	return s.String()
}
