//go:build cgo && linux

package ibverbs_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
	"github.com/rdmanet/rdmanet/internal/verbs/verbstest"
)

// TestFailedChannelIsReleased: a completion channel that failed fails its
// CQs, is replaced for new ones, and is destroyed (its two descriptors
// closed) once the last CQ made on it is.
func TestFailedChannelIsReleased(t *testing.T) {
	d, err := ibverbs.New().Open(deviceOptions())
	if err != nil {
		verbstest.Unavailable(t, err.Error())
	}
	defer d.Close()
	q, err := d.NewCQ(16, func() {})
	require.NoError(t, err)
	before := ibverbs.OpenFDs(t)
	ibverbs.FailChannel(q, errors.New("test: the channel failed"))
	_, err = q.Poll(make([]verbs.Completion, 1))
	assert.Error(t, err, "a CQ of the failed channel fails")
	// The context's channels are handed out round robin: within 8 new CQs
	// the failed one's turn comes, and a new channel (two descriptors)
	// takes its place, while q still holds the failed one.
	var qs []verbs.CQ
	defer func() {
		for _, x := range qs {
			x.Close()
		}
	}()
	for range 8 {
		x, err := d.NewCQ(16, func() {})
		require.NoError(t, err)
		qs = append(qs, x)
		_, err = x.Poll(make([]verbs.Completion, 1))
		require.NoError(t, err, "a new CQ gets a working channel")
	}
	assert.Equal(t, before+2, ibverbs.OpenFDs(t), "the replacement channel")
	require.NoError(t, q.Close())
	assert.Equal(t, before, ibverbs.OpenFDs(t), "the failed channel's descriptors are closed with its last CQ")
}

// TestCompVectorsRoundRobin: consecutive CQs of a device context are
// created on consecutive completion vectors, wrapping at the device's
// num_comp_vectors, so that every vector (every interrupt, and with it
// every CPU the device's interrupts go to) takes its share of CQs.
func TestCompVectorsRoundRobin(t *testing.T) {
	d, err := ibverbs.New().Open(deviceOptions())
	if err != nil {
		verbstest.Unavailable(t, err.Error())
	}
	defer d.Close()
	n := ibverbs.CompVectors(d)
	t.Logf("%v: num_comp_vectors %d", d, n)
	require.GreaterOrEqual(t, n, 1)
	var qs []verbs.CQ
	defer func() {
		for _, q := range qs {
			q.Close()
		}
	}()
	seen := map[int]int{}
	for i := range 2*n + 1 {
		q, err := d.NewCQ(16, func() {})
		require.NoError(t, err)
		qs = append(qs, q)
		v := ibverbs.CompVector(q)
		require.True(t, v >= 0 && v < n, "CQ %d on vector %d of %d", i, v, n)
		if i > 0 {
			prev := ibverbs.CompVector(qs[i-1])
			assert.Equal(t, (prev+1)%n, v, "CQ %d follows CQ %d (vector %d)", i, i-1, prev)
		}
		seen[v]++
	}
	assert.Len(t, seen, n, "every vector takes CQs: %v", seen)
	for v, c := range seen {
		assert.GreaterOrEqual(t, c, 2, "vector %d took %d of %d CQs", v, c, 2*n+1)
	}
}

// TestDeviceLimits: a CQ or QP deeper than the device allows (its
// max_cqe, max_qp_wr) is refused before the device is asked, with an
// error naming the limit, and leaves nothing open; a QP the device itself
// refuses twice (depth beyond its limit, asked for with inline data and
// then without) is reported with the first request's capabilities; one
// whose inline size alone is refused is made without inline data.
func TestDeviceLimits(t *testing.T) {
	d, err := ibverbs.New().Open(deviceOptions())
	if err != nil {
		verbstest.Unavailable(t, err.Error())
	}
	defer func() { assert.NoError(t, d.Close(), "nothing left open") }()
	t.Logf("%v: %s, num_comp_vectors %d", d, ibverbs.DeviceLimits(d), ibverbs.CompVectors(d))
	maxWR, maxCQE := ibverbs.MaxQPWR(d), ibverbs.MaxCQE(d)
	require.Positive(t, maxWR)
	require.Positive(t, maxCQE)

	_, err = d.NewCQ(maxCQE+1, func() {})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("max_cqe %d", maxCQE))
	t.Logf("CQ beyond max_cqe: %v", err)

	q, err := d.NewCQ(64, func() {})
	require.NoError(t, err)
	defer q.Close()
	for _, a := range []verbs.QPAttr{
		{CQ: q, SendDepth: maxWR + 1, RecvDepth: 16, MaxInline: 32},
		{CQ: q, SendDepth: 16, RecvDepth: maxWR + 1, MaxInline: 32},
	} {
		_, err = d.NewQP(a)
		require.Error(t, err, "%+v", a)
		assert.Contains(t, err.Error(), fmt.Sprintf("max_qp_wr %d", maxWR))
		t.Logf("QP beyond max_qp_wr: %v", err)
	}

	// The device's own refusal, twice: the error names the first
	// request, inline size included.
	_, err = ibverbs.NewQPUnchecked(d, verbs.QPAttr{CQ: q, SendDepth: maxWR + 1, RecvDepth: 16, MaxInline: 32})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("(send %d, recv 16, inline 32)", maxWR+1))
	assert.Contains(t, err.Error(), "without inline data")
	t.Logf("QP the device refused: %v", err)

	// An inline size no device takes: made without, inline data bounced.
	qp, err := d.NewQP(verbs.QPAttr{CQ: q, SendDepth: 16, RecvDepth: 16, MaxInline: 1 << 16})
	require.NoError(t, err)
	assert.Equal(t, 1<<16, qp.MaxInline())
	require.NoError(t, qp.Close())
}
