//go:build cgo && linux

package ibverbs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
	"github.com/rdmanet/rdmanet/internal/verbs/verbstest"
)

// pooledOpen opens a device of the test's RDMA device with a pool of
// size, or skips (fails where the device is required).
func pooledOpen(t *testing.T, size int, idle time.Duration) (verbs.Device, verbs.OpenOptions) {
	t.Helper()
	o := deviceOptions()
	o.Pool, o.PoolIdle = size, idle
	d, err := ibverbs.New().Open(o)
	if err != nil {
		verbstest.Unavailable(t, err.Error())
	}
	ibverbs.DrainPools()
	return d, o
}

// awaitIdle waits until the pools hold want protection domains.
func awaitIdle(t *testing.T, want int) {
	t.Helper()
	require.Eventually(t, func() bool { return ibverbs.Pooled().Idle == want }, 10*time.Second, 5*time.Millisecond,
		"pooled protection domains: %+v, want %d", ibverbs.Pooled(), want)
}

// TestPoolReuseScrubbed: a protection domain closed with nothing left
// open is reused by the next Open, with its regions: the same memory comes
// back zeroed, byte by byte, with the same size and access, and a QP made
// in the reused domain carries data into it.
func TestPoolReuseScrubbed(t *testing.T) {
	d, o := pooledOpen(t, 1, time.Minute)
	const size = 64 << 10
	ring, err := d.AllocMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	local, err := d.AllocMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	for i := range ring.Bytes() {
		ring.Bytes()[i] = byte(i) | 1
	}
	for i := range local.Bytes() {
		local.Bytes()[i] = 0xa5
	}
	addr, rkey := ring.Addr(), ring.RKey()
	require.NoError(t, ring.Close())
	require.NoError(t, local.Close())
	before := ibverbs.Pooled()
	require.NoError(t, d.Close())
	awaitIdle(t, 1)
	assert.Equal(t, int64(size+4096), ibverbs.Pooled().IdleBytes)

	d2, err := ibverbs.New().Open(o)
	require.NoError(t, err)
	after := ibverbs.Pooled()
	assert.Equal(t, before.Reused+1, after.Reused, "the second Open took the pooled domain")
	assert.Zero(t, after.Idle)
	// A region of another size or access is registered anew; the pooled
	// ones come back for their own size and access.
	other, err := d2.AllocMR(size, verbs.AccessLocalWrite)
	require.NoError(t, err)
	assert.NotEqual(t, addr, other.Addr())
	ring2, err := d2.AllocMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	assert.Equal(t, addr, ring2.Addr(), "the pooled ring")
	assert.Equal(t, rkey, ring2.RKey())
	local2, err := d2.AllocMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	for i, b := range ring2.Bytes() {
		if b != 0 {
			t.Fatalf("reused ring: byte %d is %#x, not zero", i, b)
		}
	}
	for i, b := range local2.Bytes() {
		if b != 0 {
			t.Fatalf("reused region: byte %d is %#x, not zero", i, b)
		}
	}
	for _, m := range []verbs.MR{other, ring2, local2} {
		require.NoError(t, m.Close())
	}
	require.NoError(t, d2.Close())
	awaitIdle(t, 1)
}

// TestPoolBound: past the bound the oldest pooled domain is freed; Opens
// past what the pool holds allocate, and none fails.
func TestPoolBound(t *testing.T) {
	d0, o := pooledOpen(t, 2, time.Minute)
	require.NoError(t, d0.Close())
	ibverbs.DrainPools()
	var ds []verbs.Device
	for range 4 {
		d, err := ibverbs.New().Open(o)
		require.NoError(t, err)
		m, err := d.AllocMR(4096, verbs.AccessLocalWrite)
		require.NoError(t, err)
		require.NoError(t, m.Close())
		ds = append(ds, d)
	}
	before := ibverbs.Pooled()
	for _, d := range ds {
		require.NoError(t, d.Close())
	}
	awaitIdle(t, 2)
	assert.Equal(t, before.Freed+2, ibverbs.Pooled().Freed, "two over the bound freed at once")
	for range 4 {
		d, err := ibverbs.New().Open(o)
		require.NoError(t, err, "an empty pool means a fresh domain")
		defer d.Close()
	}
	after := ibverbs.Pooled()
	assert.Equal(t, before.Reused+2, after.Reused)
	assert.Zero(t, after.Idle)
}

// TestPoolIdleRelease: a pooled domain is freed, memory and all, once it
// has been idle for PoolIdle.
func TestPoolIdleRelease(t *testing.T) {
	d, _ := pooledOpen(t, 4, 50*time.Millisecond)
	m, err := d.AllocMR(1<<20, verbs.AccessLocalWrite)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	freed := ibverbs.Pooled().Freed
	require.NoError(t, d.Close())
	awaitIdle(t, 0) // on its own, after 50 ms
	assert.Equal(t, freed+1, ibverbs.Pooled().Freed)
	assert.Zero(t, ibverbs.Pooled().IdleBytes)
}

// TestConformancePooled runs the conformance suite with the pool on:
// its pairs then run in reused protection domains and regions.
func TestConformancePooled(t *testing.T) {
	o := deviceOptions()
	o.Pool, o.PoolIdle = 4, time.Minute
	reused := ibverbs.Pooled().Reused
	verbstest.Run(t, ibverbs.New(), o)
	assert.Greater(t, ibverbs.Pooled().Reused, reused, "the suite reused pooled domains")
	ibverbs.DrainPools()
}

// TestPoolKeepsOnlyLastLife: a pooled domain keeps the regions of its
// last life only; a spare that life did not reuse (a connection of another
// ring size) is freed when the domain goes back to the pool.
func TestPoolKeepsOnlyLastLife(t *testing.T) {
	d, o := pooledOpen(t, 1, time.Minute)
	m, err := d.AllocMR(64<<10, verbs.AccessLocalWrite)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	require.NoError(t, d.Close())
	awaitIdle(t, 1)
	assert.Equal(t, int64(64<<10), ibverbs.Pooled().IdleBytes)

	d, err = ibverbs.New().Open(o)
	require.NoError(t, err)
	m, err = d.AllocMR(8<<10, verbs.AccessLocalWrite)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	require.NoError(t, d.Close())
	awaitIdle(t, 1)
	assert.Equal(t, int64(8<<10), ibverbs.Pooled().IdleBytes, "only the region of the last life")
	ibverbs.DrainPools()
}

// TestPoolClosedDevice: a Device closed with a region still open is not
// pooled (Close says so, and the region's Close frees the domain later),
// and a closed Device makes nothing more: no region, no QP, so nothing
// can land in a domain that went to the pool.
func TestPoolClosedDevice(t *testing.T) {
	d, _ := pooledOpen(t, 2, time.Minute)
	m, err := d.AllocMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	assert.Error(t, d.Close(), "a region is still open")
	assert.Zero(t, ibverbs.Pooled().Idle)
	require.NoError(t, m.Close())
	assert.Zero(t, ibverbs.Pooled().Idle)
	_, err = d.AllocMR(4096, verbs.AccessLocalWrite)
	assert.ErrorIs(t, err, verbs.ErrClosed)
}
