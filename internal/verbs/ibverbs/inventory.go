package ibverbs

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// The inventory: what sysfs says about the host's RDMA devices, for
// diagnostics (rsockperf doctor). It needs neither cgo nor libibverbs.

// DeviceInfo describes one RDMA device.
type DeviceInfo struct {
	Name  string
	IWARP bool // node type RNIC: its connections need rdma_cm, which rsock does not use yet
	Ports []PortInfo
}

// PortInfo describes one port of a device.
type PortInfo struct {
	Port      int
	State     string // e.g. "ACTIVE", "DOWN"
	LinkLayer string // "Ethernet" (RoCE, iWARP) or "InfiniBand"
	// Netdev and NetdevMTU are the network interface of the port's GIDs
	// and its MTU (on RoCE the RDMA MTU is the largest of 256 to 4096
	// bytes that fits it), or "" and 0.
	Netdev    string
	NetdevMTU int
	GIDs      []GIDInfo
}

// GIDInfo is one populated entry of a port's GID table.
type GIDInfo struct {
	Index  int
	GID    netip.Addr
	Type   string     // "RoCE v2", "IB/RoCE v1", or "" where not reported
	Netdev string     // the netdev a RoCE GID belongs to
	IPv4   netip.Addr // the IPv4 address of an IPv4-mapped GID, or invalid
}

// Devices lists the host's RDMA devices from /sys/class/infiniband. It
// returns an error when that directory cannot be read: no RDMA device
// (and no Soft-RoCE or soft-iWARP one) was ever registered on this host,
// or sysfs is not mounted.
func Devices() ([]DeviceInfo, error) { return sysfs{root: "/sys"}.inventory() }

func (s sysfs) inventory() ([]DeviceInfo, error) {
	names, err := s.devices()
	if err != nil {
		return nil, fmt.Errorf("ibverbs: no RDMA device: %w", err)
	}
	var out []DeviceInfo
	for _, name := range names {
		d := DeviceInfo{Name: name, IWARP: s.iwarp(name)}
		for _, p := range s.ports(name) {
			st, _ := s.read("class", "infiniband", name, "ports", strconv.Itoa(p), "state")
			if _, after, ok := strings.Cut(st, ": "); ok { // "4: ACTIVE"
				st = after
			}
			pi := PortInfo{Port: p, State: st, LinkLayer: s.linkLayer(name, p)}
			for _, g := range s.gids(name, p) {
				gi := GIDInfo{Index: g.index, GID: g.gid, Type: g.typ, Netdev: g.ndev}
				if g.gid.Is4In6() {
					gi.IPv4 = g.gid.Unmap()
				}
				pi.GIDs = append(pi.GIDs, gi)
				if pi.Netdev == "" && g.ndev != "" {
					pi.Netdev = g.ndev
					mtu, _ := s.read("class", "net", g.ndev, "mtu")
					pi.NetdevMTU, _ = strconv.Atoi(mtu)
				}
			}
			d.Ports = append(d.Ports, pi)
		}
		out = append(out, d)
	}
	return out, nil
}
