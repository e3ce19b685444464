//go:build cgo && linux

package ibverbs

import "testing"

// TestChannelVectorRotation: the context's CQs take their completion
// channel and their completion vector by one rule, CQ i channel i mod the
// channels and vector i mod the vectors, from wherever the rotation stands,
// so that every vector (and channel) gets its turn. No device needed.
func TestChannelVectorRotation(t *testing.T) {
	for _, tc := range []struct{ chans, vectors, start int }{
		{chans: 3, vectors: 4, start: 0},
		{chans: 3, vectors: 4, start: 5},
		{chans: 8, vectors: 2, start: 7},
		{chans: 2, vectors: 16, start: 1},
		{chans: 1, vectors: 1, start: 0},
		{chans: 2, vectors: 0, start: 3}, // a context reporting no vectors: vector 0
	} {
		dc := &devCtx{vectors: tc.vectors, nextChan: tc.start}
		for range tc.chans {
			dc.chans = append(dc.chans, &compChannel{})
		}
		seen := map[int]bool{}
		for k := range 3 * max(tc.chans, tc.vectors) {
			i := tc.start + k
			cc, v, err := dc.channel()
			if err != nil {
				t.Fatalf("%+v: CQ %d: %v", tc, i, err)
			}
			if want := dc.chans[i%tc.chans]; cc != want {
				t.Errorf("%+v: CQ %d got channel %p, want channel %d (%p)", tc, i, cc, i%tc.chans, want)
			}
			if want := i % max(tc.vectors, 1); v != want {
				t.Errorf("%+v: CQ %d got vector %d, want %d", tc, i, v, want)
			}
			seen[v] = true
		}
		if len(seen) != max(tc.vectors, 1) {
			t.Errorf("%+v: vectors used %v, want all %d", tc, seen, max(tc.vectors, 1))
		}
		for i, cc := range dc.chans {
			if want := 3 * max(tc.chans, tc.vectors) / tc.chans; cc.live != want {
				t.Errorf("%+v: channel %d held by %d CQs, want %d", tc, i, cc.live, want)
			}
		}
	}
}
