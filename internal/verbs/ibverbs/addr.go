package ibverbs

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// target is the device, port and GID a connection uses.
type target struct {
	dev      string
	port     int
	gidIndex int
	roce     bool // Ethernet link layer: the GID is routed (GRH), no LID
	iwarp    bool // an iWARP device: connected through rdma_cm only
	cm       bool // QPs connect through rdma_cm by default (iWARP, or asked for)
}

// sysfs reads the RDMA devices' description from a sysfs tree (normally
// /sys). Tests give it a fake tree.
type sysfs struct {
	root string
	// cm names the device the connection manager binds an IP to, or says
	// why it cannot (librdmacm missing); nil: iWARP devices are declined.
	cm func(ip netip.Addr) (string, error)
}

func (s sysfs) read(parts ...string) (string, error) {
	b, err := os.ReadFile(filepath.Join(append([]string{s.root}, parts...)...))
	return strings.TrimSpace(string(b)), err
}

// defaultTOS is the type of service the administrator set for RoCE
// connections of dev's port through rdma_cm's configfs
// (kernel/config/rdma_cm/<dev>/ports/<port>/default_roce_tos, the tree
// that exists once someone made the device's directory), or 0 where none
// is set. rdma_cm applies it to its own connections; QPs connected by GID
// take it from here.
func (s sysfs) defaultTOS(dev string, port int) uint8 {
	v, err := s.read("kernel", "config", "rdma_cm", dev, "ports", strconv.Itoa(port), "default_roce_tos")
	if err != nil {
		return 0
	}
	tos, err := strconv.ParseUint(v, 10, 8)
	if err != nil {
		return 0
	}
	return uint8(tos)
}

// carrierUp reports whether netdev is running with its carrier: false
// from the moment a close of the netdev begins (the kernel then refuses
// to read carrier), before a RoCE driver marks its port down (rxe does on
// the netdev's down event, after that netdev's sends have started to
// fail). A netdev this process cannot see (another network namespace's)
// counts as up: the port's own state decides.
func (s sysfs) carrierUp(netdev string) bool {
	v, err := s.read("class", "net", netdev, "carrier")
	return errors.Is(err, fs.ErrNotExist) || err == nil && v == "1"
}

// gidNetdev is the netdev of dev's port's GID gidIndex, or "".
func (s sysfs) gidNetdev(dev string, port, gidIndex int) string {
	for _, g := range s.gids(dev, port) {
		if g.index == gidIndex {
			return g.ndev
		}
	}
	return ""
}

// devices lists the RDMA devices, sorted.
func (s sysfs) devices() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.root, "class", "infiniband"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, nil
}

// ports lists a device's port numbers, ascending.
func (s sysfs) ports(dev string) []int {
	ents, _ := os.ReadDir(filepath.Join(s.root, "class", "infiniband", dev, "ports"))
	var ps []int
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > 0 && n < 256 {
			ps = append(ps, n)
		}
	}
	sort.Ints(ps)
	return ps
}

// iwarp reports whether dev is an iWARP device (node type RNIC).
func (s sysfs) iwarp(dev string) bool {
	nt, _ := s.read("class", "infiniband", dev, "node_type")
	return strings.Contains(nt, "RNIC")
}

// linkLayer is "Ethernet" (RoCE) or "InfiniBand".
func (s sysfs) linkLayer(dev string, port int) string {
	ll, _ := s.read("class", "infiniband", dev, "ports", strconv.Itoa(port), "link_layer")
	return ll
}

// gidEntry is one populated entry of a port's GID table.
type gidEntry struct {
	index int
	gid   netip.Addr // 16 bytes; IPv4-mapped for an IPv4 RoCE GID
	typ   string     // "RoCE v2", "IB/RoCE v1", or "" where not reported
	ndev  string     // the netdev a RoCE GID belongs to
}

// gidTableTTL is how long a port's GID table, once read, serves later
// connections. Reading it costs a file per entry (up to 256, plus two per
// populated one): in the Soft-RoCE guest that was most of a connection's
// setup (BENCHMARKS.md). A GID added or removed (an address changed on the
// netdev) is seen within the TTL.
const gidTableTTL = time.Second

var gidTables struct {
	mu sync.Mutex
	m  map[string]gidTable // by sysfs root, device and port
}

type gidTable struct {
	read    time.Time
	entries []gidEntry
}

// gids lists the populated entries of a port's GID table, read at most
// gidTableTTL ago. Callers must not modify the slice.
func (s sysfs) gids(dev string, port int) []gidEntry {
	key := s.root + "\x00" + dev + "\x00" + strconv.Itoa(port)
	gidTables.mu.Lock()
	t, ok := gidTables.m[key]
	gidTables.mu.Unlock()
	if ok && time.Since(t.read) < gidTableTTL {
		return t.entries
	}
	t = gidTable{read: time.Now(), entries: s.readGIDs(dev, port)}
	gidTables.mu.Lock()
	if gidTables.m == nil || len(gidTables.m) >= 1024 {
		gidTables.m = map[string]gidTable{} // bounded: a miss costs one read
	}
	gidTables.m[key] = t
	gidTables.mu.Unlock()
	return t.entries
}

// readGIDs reads a port's GID table from sysfs.
func (s sysfs) readGIDs(dev string, port int) []gidEntry {
	p := strconv.Itoa(port)
	ents, _ := os.ReadDir(filepath.Join(s.root, "class", "infiniband", dev, "ports", p, "gids"))
	var out []gidEntry
	for _, e := range ents {
		idx, err := strconv.Atoi(e.Name())
		if err != nil || idx < 0 || idx > 255 {
			continue
		}
		v, err := s.read("class", "infiniband", dev, "ports", p, "gids", e.Name())
		if err != nil {
			continue
		}
		g, err := netip.ParseAddr(v)
		if err != nil || !g.Is6() || g.IsUnspecified() {
			continue
		}
		typ, _ := s.read("class", "infiniband", dev, "ports", p, "gid_attrs", "types", e.Name())
		ndev, _ := s.read("class", "infiniband", dev, "ports", p, "gid_attrs", "ndevs", e.Name())
		out = append(out, gidEntry{index: idx, gid: g, typ: typ, ndev: ndev})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].index < out[j].index })
	return out
}

// targetTTL is how long a selected target serves later connections from
// the same local IP with the same overrides unchecked. Past it, a RoCE
// target found by its RoCE v2 GID is checked by reading that one GID
// entry again; any other is selected anew. Selecting reads a file or
// directory per device, port and GID entry (its cost: BENCHMARKS.md). A
// variable for tests.
var targetTTL = time.Second

var targets struct {
	mu sync.Mutex
	m  map[targetKey]cachedTarget
}

type targetKey struct {
	root           string
	ip             netip.Addr
	dev            string
	port, gidIndex int
}

type cachedTarget struct {
	t       target
	byGIDv2 bool // found as the RoCE v2 GID entry holding the IP
	checked time.Time
}

// cachedTarget is selectTarget, with its result remembered (targetTTL).
func (s sysfs) cachedTarget(local net.Addr, dev string, port, gidIndex int) (target, error) {
	ip, err := localIP(local)
	if err != nil || gidIndex >= 0 {
		return s.selectTarget(local, dev, port, gidIndex)
	}
	key := targetKey{root: s.root, ip: ip, dev: dev, port: port, gidIndex: gidIndex}
	targets.mu.Lock()
	c, ok := targets.m[key]
	targets.mu.Unlock()
	switch {
	case ok && time.Since(c.checked) < targetTTL:
		return c.t, nil
	case ok && c.byGIDv2 && s.holdsV2(c.t, ip):
		c.checked = time.Now()
	default:
		t, err := s.selectTarget(local, dev, port, gidIndex)
		if err != nil {
			return t, err
		}
		c = cachedTarget{t: t, checked: time.Now()}
		if t.roce {
			for _, g := range s.gids(t.dev, t.port) {
				c.byGIDv2 = c.byGIDv2 || (g.index == t.gidIndex && g.typ == "RoCE v2")
			}
		}
	}
	targets.mu.Lock()
	if targets.m == nil || len(targets.m) >= 1024 {
		targets.m = map[targetKey]cachedTarget{} // bounded: a miss costs one selection
	}
	targets.m[key] = c
	targets.mu.Unlock()
	return c.t, nil
}

// holdsV2 reports whether t's GID entry still holds ip as a RoCE v2 GID
// (nothing can be preferred to it).
func (s sysfs) holdsV2(t target, ip netip.Addr) bool {
	p, i := strconv.Itoa(t.port), strconv.Itoa(t.gidIndex)
	v, err := s.read("class", "infiniband", t.dev, "ports", p, "gids", i)
	if err != nil {
		return false
	}
	g, err := netip.ParseAddr(v)
	if err != nil || g != netip.AddrFrom16(ip.As16()) {
		return false
	}
	typ, _ := s.read("class", "infiniband", t.dev, "ports", p, "gid_attrs", "types", i)
	return typ == "RoCE v2"
}

// errNoDevice wraps the reasons no device fits; it is reported as the
// provider being unavailable for this connection.
var errNoDevice = errors.New("no RDMA device fits")

// localIP is the IP of the bootstrap connection's local end.
func localIP(a net.Addr) (netip.Addr, error) {
	ta, ok := a.(*net.TCPAddr)
	if !ok || ta == nil {
		return netip.Addr{}, fmt.Errorf("%w: no local TCP address to find a device by", errNoDevice)
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return netip.Addr{}, fmt.Errorf("%w: bad local address %v", errNoDevice, a)
	}
	return ip.Unmap(), nil
}

// selectTarget picks the device, port and GID for a connection whose
// bootstrap socket is bound to local (on RoCE, the GID holding that IP,
// preferring RoCE v2), honouring the overrides: dev ("" for any), port (0
// for any) and gidIndex (-1 for automatic).
func (s sysfs) selectTarget(local net.Addr, dev string, port, gidIndex int) (target, error) {
	devs, err := s.devices()
	if err != nil || len(devs) == 0 {
		return target{}, fmt.Errorf("%w: this host has no RDMA devices (no %s)", errNoDevice, filepath.Join(s.root, "class", "infiniband"))
	}
	if dev != "" {
		found := false
		for _, d := range devs {
			found = found || d == dev
		}
		if !found {
			return target{}, fmt.Errorf("%w: no RDMA device named %q (have %s)", errNoDevice, dev, strings.Join(devs, ", "))
		}
		devs = []string{dev}
	}
	var skipped []string
	var usable, iwarps []string
	for _, d := range devs {
		if !s.iwarp(d) {
			usable = append(usable, d)
		} else if s.cm == nil {
			skipped = append(skipped, d+" is iWARP, whose connections need rdma_cm, not available here")
		} else {
			iwarps = append(iwarps, d)
		}
	}
	portsOf := func(d string) []int {
		if port > 0 {
			return []int{port}
		}
		return s.ports(d)
	}
	// An explicit GID index needs no address match.
	if gidIndex >= 0 {
		for _, d := range append(usable, iwarps...) {
			if ps := portsOf(d); len(ps) > 0 {
				iw := s.iwarp(d)
				return target{dev: d, port: ps[0], gidIndex: gidIndex, roce: !iw && s.linkLayer(d, ps[0]) != "InfiniBand", iwarp: iw}, nil
			}
		}
		return target{}, fmt.Errorf("%w: %s", errNoDevice, strings.Join(append(skipped, "no device and port for the GID index override"), "; "))
	}
	ip, err := localIP(local)
	if err != nil {
		return target{}, err
	}
	want := netip.AddrFrom16(ip.As16()) // IPv4 as ::ffff:a.b.c.d, as RoCE stores it
	var best *target
	bestV2 := false
	for _, d := range usable {
		for _, p := range portsOf(d) {
			ll := s.linkLayer(d, p)
			for _, g := range s.gids(d, p) {
				if g.gid != want {
					continue
				}
				v2 := g.typ == "RoCE v2"
				if best == nil || (v2 && !bestV2) {
					best = &target{dev: d, port: p, gidIndex: g.index, roce: ll != "InfiniBand"}
					bestV2 = v2
				}
			}
		}
	}
	if best != nil {
		return *best, nil
	}
	// InfiniBand: the address belongs to an IPoIB netdev; use the port's
	// GID 0 (routing is by LID).
	if t, ok := s.ipoibTarget(ip, usable, port); ok {
		return t, nil
	}
	// iWARP: a device has no GID per address; the connection manager
	// knows which device serves the IP.
	if len(iwarps) > 0 {
		if t, why := s.iwarpTarget(ip, iwarps, port); why == "" {
			return t, nil
		} else {
			skipped = append(skipped, why)
		}
	}
	if ip.IsLoopback() {
		skipped = append(skipped, fmt.Sprintf("%v is a loopback address, which no RDMA device serves (dial the host's own address)", ip))
	} else {
		skipped = append(skipped, fmt.Sprintf("no RDMA port has a GID for %v", ip))
	}
	return target{}, fmt.Errorf("%w: %s", errNoDevice, strings.Join(skipped, "; "))
}

// ipoibTarget finds the InfiniBand device under the netdev holding ip.
func (s sysfs) ipoibTarget(ip netip.Addr, devs []string, port int) (target, bool) {
	ifs, err := net.Interfaces()
	if err != nil {
		return target{}, false
	}
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		has := false
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Unmap() == ip {
				has = true
			}
		}
		if !has {
			continue
		}
		ents, _ := os.ReadDir(filepath.Join(s.root, "class", "net", ifc.Name, "device", "infiniband"))
		for _, e := range ents {
			for _, d := range devs {
				if d != e.Name() {
					continue
				}
				p := port
				if p == 0 {
					p = 1
					if v, err := s.read("class", "net", ifc.Name, "dev_port"); err == nil {
						if n, err := strconv.Atoi(v); err == nil && n >= 0 && n < 255 {
							p = n + 1
						}
					}
				}
				if s.linkLayer(d, p) == "InfiniBand" {
					return target{dev: d, port: p, gidIndex: 0}, true
				}
			}
		}
	}
	return target{}, false
}

// iwarpTarget finds the iWARP device rdma_cm binds ip to, or says why
// none fits.
func (s sysfs) iwarpTarget(ip netip.Addr, iwarps []string, port int) (target, string) {
	name, err := s.cm(ip)
	if err != nil {
		return target{}, fmt.Sprintf("iWARP (%s): %v", strings.Join(iwarps, ", "), err)
	}
	for _, d := range iwarps {
		if d != name {
			continue
		}
		p := port
		if p == 0 {
			if ps := s.ports(d); len(ps) > 0 {
				p = ps[0]
			}
		}
		if p == 0 {
			return target{}, d + " has no port"
		}
		return target{dev: d, port: p, iwarp: true}, ""
	}
	return target{}, fmt.Sprintf("rdma_cm binds %v to %s, not to an iWARP device (%s)", ip, name, strings.Join(iwarps, ", "))
}

// addrIP is the IP of a TCP address (invalid for anything else).
func addrIP(a net.Addr) netip.Addr {
	ta, ok := a.(*net.TCPAddr)
	if !ok || ta == nil {
		return netip.Addr{}
	}
	ip, _ := netip.AddrFromSlice(ta.IP)
	return ip.Unmap()
}
