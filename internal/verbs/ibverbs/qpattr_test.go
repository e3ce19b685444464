//go:build cgo && linux

package ibverbs_test

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
	"github.com/rdmanet/rdmanet/internal/verbs/verbstest"
)

// TestQPAttributes: what rsock asks of a connected QP is what the device
// holds, on both ends: RTS; remote write and never remote read; the
// path's partition (pkey index 0 on RoCE, whose only partition is the
// default one); the configured ACK timeout and retry count and rsock's
// RNR retry; on RoCE a GRH with the configured traffic class. Through
// rdma_cm (RSOCK_VERBS_CM=1) the partition, GRH and class come from
// rdma_init_qp_attr, that is from the route's path record, and the
// access rights, timeout and retries are still rsock's. iWARP devices are
// skipped: iw_cm and the driver move their QPs, and a path's attributes do
// not apply.
func TestQPAttributes(t *testing.T) {
	o := deviceOptions()
	o.TrafficClass, o.AckTimeout, o.RetryCount = 72, 100*time.Millisecond, 3
	da, db := openPair(t, o, "iw_cm and the driver move the QP; a path's attributes do not apply")
	a, b := newEnd(t, da), newEnd(t, db)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a hang guard
	defer cancel()
	connect(t, ctx, a, b)

	code, err := ibverbs.AckTimeoutCode(o.AckTimeout)
	require.NoError(t, err)
	const rts, localWrite, remoteWrite = 3, 1, 2 // IBV_QPS_RTS, IBV_ACCESS_*
	for name, got := range endAttrs(t, a, b) {
		assert.Equal(t, rts, got.State, name)
		assert.Equal(t, localWrite|remoteWrite, got.Access, "%s: access rights (4 would be remote read)", name)
		assert.Equal(t, 0, got.PKeyIndex, name)
		assert.Equal(t, o.Port, got.Port, name)
		assert.True(t, got.Global, "%s: RoCE needs a GRH", name)
		assert.Equal(t, o.TrafficClass, got.TrafficClass, name)
		assert.Equal(t, int(code), got.Timeout, name)
		assert.Equal(t, o.RetryCount, got.RetryCount, name)
		assert.Equal(t, 6, got.RNRRetry, name)
	}
}

// endAttrs asks the device for the attributes of a's and b's QPs, by
// their role.
func endAttrs(t *testing.T, a, b *end) map[string]ibverbs.QPAttrs {
	m := map[string]ibverbs.QPAttrs{}
	for name, e := range map[string]*end{"active": a, "passive": b} {
		got, err := ibverbs.QueryQP(e.qp)
		require.NoError(t, err)
		t.Logf("%s end (rdma_cm: %v): %+v", name, ibverbs.ViaCM(e.qp), got)
		m[name] = got
	}
	return m
}

// openPair opens two Devices with o for the test, or skips it on iWARP
// for the reason given.
func openPair(t *testing.T, o verbs.OpenOptions, iwarp string) (verbs.Device, verbs.Device) {
	open := func() verbs.Device {
		d, err := ibverbs.New().Open(o)
		if err != nil {
			verbstest.Unavailable(t, err.Error())
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	da, db := open(), open()
	if ibverbs.IWARP(da) {
		t.Skip("iWARP: " + iwarp)
	}
	return da, db
}

// pathRecord is a path record in the SA's wire format (IBA 15.2.5.16,
// struct ibv_path_record, 64 bytes), with the fields rsock's test varies.
// The rest is as rdma_cm fills it for a RoCE v2 route
// (cma_resolve_iboe_route): no LIDs, one reversible path, each selector
// "exactly".
type pathRecord struct {
	sgid, dgid [16]byte
	hopLimit   uint8
	tclass     uint8
	pkey       uint16
	sl         uint8
	mtu, rate  uint8 // enum ibv_mtu, enum ibv_rate
	lifetime   uint8 // 4.096 us << lifetime
}

func (p pathRecord) wire() *[64]byte {
	var b [64]byte // service ID 0; DLID and SLID 0 (bytes 40-43)
	copy(b[8:24], p.dgid[:])
	copy(b[24:40], p.sgid[:])
	binary.BigEndian.PutUint32(b[44:], uint32(p.hopLimit)) // flow label 0
	b[48] = p.tclass
	b[49] = 0x80 | 1 // reversible, one path
	binary.BigEndian.PutUint16(b[50:], p.pkey)
	binary.BigEndian.PutUint16(b[52:], uint16(p.sl)) // QoS class 0
	const exactly = 2 << 6
	b[54], b[55], b[56] = exactly|p.mtu, exactly|p.rate, exactly|p.lifetime
	return &b
}

// TestPathRecord: through rdma_cm, a connection's QPs take the partition
// (pkey index), SL and traffic class of the path record the active side
// connects on, on both ends, and a configured ServiceLevel replaces the
// path's SL (the SL checked is the one rsock gave the device: Soft-RoCE
// keeps none to report); a path on a partition the port is not a member
// of is refused at connect, where without it the packets would be dropped
// until the retries ran out. The records go to the kernel as ibacm gives them
// (RDMA_OPTION_IB_PATH), so rdma_cm's own conversion of a path to QP
// attributes is what rsock's code path applies. On RoCE, the only
// partition is the default one (0xffff, index 0); InfiniBand's partitions
// and its GRH-or-not choice need an IB port, which the guest has not.
// iWARP devices are skipped: iw_cm has no path records.
func TestPathRecord(t *testing.T) {
	base := deviceOptions()
	base.ConnectionManager, base.TrafficClass, base.ServiceLevel = true, -1, -1
	for _, c := range []struct {
		name       string
		pkey       uint16
		sl, tclass uint8
		configured int // ServiceLevel on both ends, -1: the path's
		wantSL     int
		refused    bool
	}{
		{name: "as rdma_cm builds it", pkey: 0xffff, configured: -1},
		{name: "lossless class", pkey: 0xffff, sl: 3, tclass: 26<<2 | 2, configured: -1, wantSL: 3},
		{name: "limited member", pkey: 0x7fff, sl: 5, configured: -1, wantSL: 5},
		{name: "configured SL", pkey: 0xffff, sl: 3, tclass: 26 << 2, configured: 6, wantSL: 6},
		{name: "foreign partition", pkey: 0x8001, sl: 1, configured: -1, refused: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := base
			o.ServiceLevel = c.configured
			da, db := openPair(t, o, "iw_cm has no path records")
			rec := pathRecord{hopLimit: 64, tclass: c.tclass, pkey: c.pkey, sl: c.sl, mtu: 3, rate: 3, lifetime: 16}
			ibverbs.SetPathHook(t, func(local, remote netip.Addr) *[64]byte {
				rec.sgid, rec.dgid = local.As16(), remote.As16() // RoCE GIDs: the IPs, v4 mapped
				return rec.wire()
			})
			a, b := newEnd(t, da), newEnd(t, db)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a hang guard
			defer cancel()
			require.NoError(t, b.qp.Connect(ctx, a.qp.Info(), false), "passive Connect")
			err := a.qp.Connect(ctx, b.qp.Info(), true)
			if c.refused {
				require.ErrorIs(t, err, verbs.ErrPeerInfo, "a path on partition %#x", c.pkey)
				assert.ErrorContains(t, err, "partition")
				t.Logf("refused: %v", err)
				return
			}
			require.NoError(t, err, "active Connect")
			require.NoError(t, b.qp.Established(ctx), "Established")
			for name, got := range endAttrs(t, a, b) {
				assert.Equal(t, 0, got.PKeyIndex, "%s: pkey index (RoCE's one partition)", name)
				assert.Equal(t, c.wantSL, got.SL, "%s: SL", name)
				assert.Equal(t, int(c.tclass), got.TrafficClass, "%s: traffic class", name)
				assert.True(t, got.Global, "%s: RoCE needs a GRH", name)
			}
		})
	}
}
