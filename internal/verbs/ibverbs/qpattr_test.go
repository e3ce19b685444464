//go:build cgo && linux

package ibverbs_test

import (
	"context"
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
		t.Skip("iWARP: iw_cm and the driver move the QP; a path's attributes do not apply")
	}
	a, b := newEnd(t, da), newEnd(t, db)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a hang guard
	defer cancel()
	connect(t, ctx, a, b)

	code, err := ibverbs.AckTimeoutCode(o.AckTimeout)
	require.NoError(t, err)
	const rts, localWrite, remoteWrite = 3, 1, 2 // IBV_QPS_RTS, IBV_ACCESS_*
	for _, e := range []struct {
		name string
		qp   verbs.QP
	}{{"active", a.qp}, {"passive", b.qp}} {
		got, err := ibverbs.QueryQP(e.qp)
		require.NoError(t, err)
		t.Logf("%s end (rdma_cm: %v): %+v", e.name, ibverbs.ViaCM(e.qp), got)
		assert.Equal(t, rts, got.State, e.name)
		assert.Equal(t, localWrite|remoteWrite, got.Access, "%s: access rights (4 would be remote read)", e.name)
		assert.Equal(t, 0, got.PKeyIndex, e.name)
		assert.Equal(t, o.Port, got.Port, e.name)
		assert.True(t, got.Global, "%s: RoCE needs a GRH", e.name)
		assert.Equal(t, o.TrafficClass, got.TrafficClass, e.name)
		assert.Equal(t, int(code), got.Timeout, e.name)
		assert.Equal(t, o.RetryCount, got.RetryCount, e.name)
		assert.Equal(t, 6, got.RNRRetry, e.name)
	}
}
