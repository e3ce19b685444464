//go:build cgo && linux

package ibverbs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
)

// BenchmarkSetup times the pieces a verbs connection sets up, each made
// and destroyed once per op on a real device: the device (context and
// protection domain), a CQ with its completion channel, a QP, and memory
// regions of the sizes rsock registers (the ring and the staging buffer
// default to 1 MiB each). It skips without a device.
func BenchmarkSetup(b *testing.B) {
	p := ibverbs.New()
	o := deviceOptions()
	dev, err := p.Open(o)
	if err != nil {
		b.Skipf("no verbs device: %v", err)
	}
	defer dev.Close()
	b.Run("OpenDevice", func(b *testing.B) {
		for range b.N {
			d, err := p.Open(o)
			if err != nil {
				b.Fatal(err)
			}
			_ = d.Close()
		}
	})
	b.Run("NewCQ", func(b *testing.B) {
		for range b.N {
			cq, err := dev.NewCQ(256, nil)
			if err != nil {
				b.Fatal(err)
			}
			_ = cq.Close()
		}
	})
	b.Run("NewQP", func(b *testing.B) {
		cq, err := dev.NewCQ(256, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer cq.Close()
		for range b.N {
			qp, err := dev.NewQP(verbs.QPAttr{CQ: cq, SendDepth: 64, RecvDepth: 16, MaxInline: 32})
			if err != nil {
				b.Fatal(err)
			}
			_ = qp.Close()
		}
	})
	b.Run("ConnectPair", func(b *testing.B) {
		// Two QPs of the device connected to each other, as the two
		// ends of a connection do: Connect passive, Connect active,
		// Established (the QPs' state changes, address resolution and,
		// on iWARP or with rdma_cm, the connection manager's exchange).
		cq, err := dev.NewCQ(256, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer cq.Close()
		attr := verbs.QPAttr{CQ: cq, SendDepth: 64, RecvDepth: 16, MaxInline: 32}
		ctx := context.Background()
		for range b.N {
			b.StopTimer()
			qa, err := dev.NewQP(attr)
			if err != nil {
				b.Fatal(err)
			}
			qb, err := dev.NewQP(attr)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if err := qb.Connect(ctx, qa.Info(), false); err != nil {
				b.Fatal(err)
			}
			if err := qa.Connect(ctx, qb.Info(), true); err != nil {
				b.Fatal(err)
			}
			if err := qb.Established(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			_ = qa.Close()
			_ = qb.Close()
			b.StartTimer()
		}
	})
	for _, size := range []int{4 << 10, 64 << 10, 256 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("AllocMR/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for range b.N {
				mr, err := dev.AllocMR(size, verbs.AccessRemoteWrite)
				if err != nil {
					b.Fatal(err)
				}
				_ = mr.Close()
			}
		})
	}
	// A pooled 1 MiB ring handed out again and closed, per op, by a
	// Device that pools: kept registered (closed with no QP: a
	// connection's end), or retired (closed while a QP exists: a ring
	// replaced by growth), which Close deregisters and AllocMR registers
	// again.
	for _, retired := range []bool{false, true} {
		b.Run(fmt.Sprintf("Reuse/retired=%v/1024KiB", retired), func(b *testing.B) {
			o := o
			o.Pool, o.PoolIdle = 1, time.Minute
			d, err := p.Open(o)
			if err != nil {
				b.Fatal(err)
			}
			defer ibverbs.DrainPools()
			defer d.Close()
			if retired {
				cq, err := d.NewCQ(16, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer cq.Close()
				qp, err := d.NewQP(verbs.QPAttr{CQ: cq, SendDepth: 4, RecvDepth: 4})
				if err != nil {
					b.Fatal(err)
				}
				defer qp.Close()
			}
			b.SetBytes(1 << 20)
			for range b.N {
				mr, err := d.AllocMR(1<<20, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
				if err != nil {
					b.Fatal(err)
				}
				_ = mr.Close()
			}
		})
	}
	// One side's endpoint as rsock makes it at the default ring, made
	// and closed per op: device, CQ, QP, ring (1 MiB, remote-writable),
	// state-message buffers (4 KiB) and staging (1 MiB), without and with
	// the pool of protection domains.
	for _, pool := range []int{0, 4} {
		b.Run(fmt.Sprintf("Endpoint/pool=%d", pool), func(b *testing.B) {
			o := o
			o.Pool, o.PoolIdle = pool, time.Minute
			defer ibverbs.DrainPools()
			for range b.N {
				d, err := p.Open(o)
				if err != nil {
					b.Fatal(err)
				}
				cq, err := d.NewCQ(320, nil)
				if err != nil {
					b.Fatal(err)
				}
				qp, err := d.NewQP(verbs.QPAttr{CQ: cq, SendDepth: 256, RecvDepth: 64, MaxInline: 32})
				if err != nil {
					b.Fatal(err)
				}
				var mrs []verbs.MR
				for _, r := range []struct {
					size   int
					access verbs.Access
				}{{1 << 20, verbs.AccessLocalWrite | verbs.AccessRemoteWrite}, {4 << 10, verbs.AccessLocalWrite}, {1 << 20, verbs.AccessLocalWrite}} {
					mr, err := d.AllocMR(r.size, r.access)
					if err != nil {
						b.Fatal(err)
					}
					mrs = append(mrs, mr)
				}
				_ = qp.Close()
				_ = cq.Close()
				for _, mr := range mrs {
					_ = mr.Close()
				}
				if err := d.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
