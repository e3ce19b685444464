//go:build cgo && linux

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"maps"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// The pool of protection domains.
//
// Registering memory is most of what a verbs connection costs to set up
// (BENCHMARKS.md). So a Device that is closed with nothing of its
// own left open (every QP and region closed) goes, with the regions it
// registered, to its device context's pool: at most OpenOptions.Pool of
// them per context, each for at most OpenOptions.PoolIdle. The next Open
// on that context takes the most recently pooled one instead of allocating
// a protection domain, and its AllocMR hands out a spare region of the same
// size and access instead of registering one.
//
// What keeps connections apart:
//   - A region is zeroed when AllocMR hands it out again, not when it is
//     closed: a new owner never receives bytes of an earlier one, even
//     bytes that reached the region while it was spare.
//   - A remote-writable region closed while a QP of its Device exists (a
//     ring retired by growth: the peer still holds its rkey) is
//     deregistered at Close and kept as memory only; AllocMR registers it
//     again when it hands it out. A peer's WRITE with the old rkey fails at
//     the device (MR.Close says why not ibv_rereg_mr).
//   - A protection domain is pooled only once its QPs are destroyed, and a
//     QP is always made fresh: no peer of an earlier connection holds a QP
//     that can reach the regions.
//   - Only this process's connections share a pool, and only on one device.
//
// Pool exhaustion is never an error: past the bound a Device is freed as
// before, and an Open that finds the pool empty allocates. A region, CQ or
// QP that the host refuses for lack of lockable memory frees every pool of
// the process (DrainPools) and is tried once more. Regions over
// maxPooledRegion are not kept, and a Device with anything of it still
// open is not pooled.

// pdEntry is a pooled protection domain with its spare regions.
type pdEntry struct {
	pd     *C.struct_rs_pd
	spare  []*MR
	expiry time.Time
}

// pdPool is a device context's pool. Its fields are guarded by the
// context's mu.
type pdPool struct {
	idle  []pdEntry // most recent last
	timer *time.Timer
}

// PoolStats describes the pools of every opened device context.
type PoolStats struct {
	Idle      int    // pooled protection domains
	IdleBytes int64  // bytes of their spare regions (pinned, unless retired: MR.Close)
	Reused    uint64 // Opens that took a pooled protection domain
	Fresh     uint64 // Opens that allocated one
	Freed     uint64 // pooled ones freed: idle too long, over the bound, or for memory
}

// poolCount counts for PoolStats. freed is counted where entries leave
// a pool, under the context's mu, so that Idle and Freed agree.
var poolCount struct {
	reused, fresh, freed atomic.Uint64
}

// Pooled reports the pools' state.
func Pooled() PoolStats {
	var st PoolStats
	for _, dc := range openedContexts() {
		dc.mu.Lock()
		st.Idle += len(dc.pool.idle)
		for _, e := range dc.pool.idle {
			for _, m := range e.spare {
				st.IdleBytes += int64(m.size)
			}
		}
		dc.mu.Unlock()
	}
	st.Reused, st.Fresh, st.Freed = poolCount.reused.Load(), poolCount.fresh.Load(), poolCount.freed.Load()
	return st
}

// openedContexts lists the process's device contexts.
func openedContexts() []*devCtx {
	contexts.mu.Lock()
	defer contexts.mu.Unlock()
	return slices.Collect(maps.Values(contexts.ctxs))
}

// DrainPools frees every pooled protection domain of the process.
func DrainPools() {
	for _, dc := range openedContexts() {
		dc.drainPool()
	}
}

// takePD returns a pooled protection domain and its spare regions, or a
// nil pd when the pool is empty or the device has failed.
func (dc *devCtx) takePD() (*C.struct_rs_pd, []*MR) {
	dc.mu.Lock()
	var e pdEntry
	if n := len(dc.pool.idle); n > 0 && dc.dead == nil {
		e = dc.pool.idle[n-1]
		dc.pool.idle[n-1] = pdEntry{}
		dc.pool.idle = dc.pool.idle[:n-1]
	}
	dc.mu.Unlock()
	if e.pd != nil {
		poolCount.reused.Add(1)
	} else {
		poolCount.fresh.Add(1)
	}
	return e.pd, e.spare
}

// putPD pools a closed Device's protection domain and spares, freeing the
// oldest pooled one if that passes max. It reports false, having pooled
// nothing, when max is not positive or the device has failed.
func (dc *devCtx) putPD(pd *C.struct_rs_pd, spare []*MR, max int, idle time.Duration) bool {
	if max <= 0 || idle <= 0 {
		return false
	}
	dc.mu.Lock()
	if dc.dead != nil {
		dc.mu.Unlock()
		return false
	}
	dc.pool.idle = append(dc.pool.idle, pdEntry{pd: pd, spare: spare, expiry: time.Now().Add(idle)})
	var over []pdEntry
	if n := len(dc.pool.idle) - max; n > 0 {
		over = append(over, dc.pool.idle[:n]...)
		dc.pool.idle = append(dc.pool.idle[:0], dc.pool.idle[n:]...)
		poolCount.freed.Add(uint64(n))
	}
	dc.scheduleLocked()
	dc.mu.Unlock()
	dc.freeEntries(over)
	return true
}

// scheduleLocked arms the timer for the earliest expiry (the entries are
// pooled in order, but their idle bounds may differ).
func (dc *devCtx) scheduleLocked() {
	if len(dc.pool.idle) == 0 {
		return
	}
	first := dc.pool.idle[0].expiry
	for _, e := range dc.pool.idle[1:] {
		if e.expiry.Before(first) {
			first = e.expiry
		}
	}
	d := max(time.Until(first), 0)
	if dc.pool.timer == nil {
		dc.pool.timer = time.AfterFunc(d, dc.expire)
	} else {
		dc.pool.timer.Reset(d)
	}
}

// expire frees the entries whose time is up.
func (dc *devCtx) expire() {
	now := time.Now()
	dc.mu.Lock()
	var gone []pdEntry
	keep := dc.pool.idle[:0]
	for _, e := range dc.pool.idle {
		if now.Before(e.expiry) {
			keep = append(keep, e)
		} else {
			gone = append(gone, e)
		}
	}
	clear(dc.pool.idle[len(keep):])
	dc.pool.idle = keep
	poolCount.freed.Add(uint64(len(gone)))
	dc.scheduleLocked()
	dc.mu.Unlock()
	dc.freeEntries(gone)
}

// drainPool frees every pooled entry of the context.
func (dc *devCtx) drainPool() {
	dc.mu.Lock()
	gone := dc.pool.idle
	dc.pool.idle = nil
	poolCount.freed.Add(uint64(len(gone)))
	dc.mu.Unlock()
	dc.freeEntries(gone)
}

func (dc *devCtx) freeEntries(es []pdEntry) {
	for _, e := range es {
		_ = dc.freePD(e.pd, e.spare)
	}
}

// freePD deregisters spare regions and deallocates pd; a failed context
// shuts down once its last is freed (releaseIfDead).
func (dc *devCtx) freePD(pd *C.struct_rs_pd, spare []*MR) error {
	var err error
	for _, m := range spare {
		err = errors.Join(err, m.free())
	}
	if e := C.rs_dealloc_pd(pd); e != 0 {
		return errors.Join(err, errnoErr("dealloc PD", e)) // still counted: the context stays
	}
	dc.mu.Lock()
	dc.pds--
	dc.mu.Unlock()
	dc.releaseIfDead()
	return err
}

// spareMR takes a spare region of size bytes and flags from d, or nil, for
// register to hand out. It counts the region in d.live (or, when it
// returns nil, the one the caller registers, or calls dropLive for),
// unless d is closed: checked under d.mu, so that nothing is made in a
// protection domain already pooled.
func (d *Device) spareMR(size int, flags C.int) (*MR, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return nil, verbs.ErrClosed
	}
	d.live++
	for _, list := range []*[]*MR{&d.spare, &d.inherited} {
		for i, m := range *list {
			if m.size == size && m.flags == flags {
				*list = append((*list)[:i], (*list)[i+1:]...)
				return m, nil
			}
		}
	}
	return nil, nil
}

// addLive counts a QP about to be made in d (dropQP undoes it if that
// fails), unless d is closed.
func (d *Device) addLive() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return verbs.ErrClosed
	}
	d.live++
	d.qps++
	return nil
}

// dropQP counts a QP of d destroyed (or, after addLive, one that was not
// made).
func (d *Device) dropQP() {
	d.mu.Lock()
	d.qps--
	d.mu.Unlock()
	d.dropLive()
}

// dropLive counts a QP or region of d gone (or, after spareMR or addLive,
// one that was not made). The last one of a Device closed while they were
// open frees its protection domain (Close could not).
func (d *Device) dropLive() {
	d.mu.Lock()
	d.live--
	orphan := d.orphan && d.live == 0
	spare := d.spare
	if orphan {
		d.spare, d.orphan = nil, false
	}
	d.mu.Unlock()
	if orphan {
		_ = d.dc.freePD(d.pd, spare)
	}
}

// keepMR keeps a closed region among d's spares, unless d does not pool or
// is closed: it reports whether it kept it. A remote-writable region is
// retired first (deregistered: see MR.Close) if a QP of d exists, and not
// kept if that fails. The region is not zeroed here: register does it
// when it hands the region out.
func (d *Device) keepMR(m *MR) bool {
	if d.pool <= 0 || m.size > maxPooledRegion {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return false
	}
	// Decided under the lock that NewQP's count takes (addLive): a QP
	// made after this point finds the region deregistered, or belongs
	// to the same Device, whose peers may write its regions anyway
	// (verbs.Device).
	if m.rkey != 0 && d.qps > 0 && m.retire() != nil {
		return false // free tries again and reports it
	}
	d.spare = append(d.spare, m)
	d.live--
	return true
}

// maxPooledRegion is the largest region a pool keeps: past it (a ring of
// 32 MiB or more) a region is freed at Close, so that the pool's pinned
// memory stays bounded by its count times a few tens of MiB.
const maxPooledRegion = 32 << 20

// outOfMemory reports whether a registration failed for lack of lockable
// memory.
func outOfMemory(e C.int) bool {
	return syscall.Errno(e) == syscall.ENOMEM || syscall.Errno(e) == syscall.EAGAIN
}
