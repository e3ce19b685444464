package doctor

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
	"github.com/rdmanet/rdmanet/internal/verbs/shm"
	"github.com/rdmanet/rdmanet/rsock"
)

// platform reports Linux's transports: libibverbs, the RDMA devices, the
// locked-memory limit, shm's primitives, and a connection to this process
// over each.
func platform(w io.Writer, o Options) {
	fmt.Fprintln(w, "\nverbs")
	if err := ibverbs.Load(); err != nil {
		fmt.Fprintf(w, "  libibverbs: not usable: %v\n", err)
	} else {
		fmt.Fprintln(w, "  libibverbs: loaded")
	}
	devs, err := ibverbs.Devices()
	var roce []netip.Addr // local IPv4 addresses with a RoCE v2 GID on an active port
	var iwarp []string    // iWARP devices
	switch {
	case err != nil:
		fmt.Fprintf(w, "  no RDMA device: %v (no RDMA NIC here, and no Soft-RoCE or soft-iWARP device: for one, `rdma link add rxe0 type rxe netdev eth0`)\n", err)
	case len(devs) == 0:
		fmt.Fprintln(w, "  no RDMA device: /sys/class/infiniband is empty")
	}
	for _, d := range devs {
		kind := "InfiniBand"
		if len(d.Ports) > 0 && d.Ports[0].LinkLayer == "Ethernet" {
			kind = "RoCE"
		}
		if d.IWARP {
			kind = "iWARP, connected through rdma_cm"
			iwarp = append(iwarp, d.Name)
		}
		fmt.Fprintf(w, "  %s (%s)\n", d.Name, kind)
		for _, p := range d.Ports {
			mtu := ""
			if p.Netdev != "" {
				mtu = fmt.Sprintf(", netdev %s MTU %d", p.Netdev, p.NetdevMTU)
			}
			fmt.Fprintf(w, "    port %d: %s, link layer %s%s\n", p.Port, p.State, p.LinkLayer, mtu)
			for _, g := range p.GIDs {
				ip := ""
				if g.IPv4.IsValid() {
					ip = " IPv4 " + g.IPv4.String()
					if !d.IWARP && p.State == "ACTIVE" && g.Type == "RoCE v2" {
						roce = append(roce, g.IPv4)
					}
				}
				if d.IWARP {
					// One GID, derived from the MAC; sysfs's type label is RoCE's.
					fmt.Fprintf(w, "      GID %d %s (from the MAC; iWARP is addressed by IP)\n", g.Index, g.GID)
					continue
				}
				fmt.Fprintf(w, "      GID %d %s [%s] %s%s\n", g.Index, g.GID, g.Type, g.Netdev, ip)
			}
		}
	}
	if len(iwarp) > 0 {
		roce = append(roce, iwarpAddrs(w, iwarp)...)
	}
	if len(devs) > 0 {
		if len(roce) == 0 {
			fmt.Fprintln(w, "  no active port has a RoCE v2 GID with an IPv4 address, and no address belongs to an iWARP device: verbs connections by IP cannot find a device")
		} else {
			fmt.Fprintf(w, "  IPv4 addresses verbs connections can use: %v\n", roce)
		}
	}
	memlock(w)

	fmt.Fprintln(w, "\nshm")
	shmPrimitives(w)

	fmt.Fprintln(w, "\nself-tests (a connection to this process)")
	selfTest(w, "shm", "127.0.0.1", o.Timeout)
	live, budget := shm.Mappings()
	fmt.Fprintf(w, "  shm mappings of this process: %d of a budget of %d\n", live, budget)
	if len(roce) == 0 {
		fmt.Fprintln(w, "  verbs: not tried: no address with a RoCE v2 GID or on an iWARP device")
	}
	for _, ip := range roce {
		selfTest(w, "verbs", ip.String(), o.Timeout)
	}
}

// shmPrimitives checks what shm is made of: memfds, abstract Unix sockets
// (its rendezvous), and the network namespace two processes must share.
func shmPrimitives(w io.Writer) {
	if fd, err := unix.MemfdCreate("rsock-doctor", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING); err != nil {
		fmt.Fprintf(w, "  memfd_create: fails: %v\n", err)
	} else {
		_ = unix.Close(fd)
		fmt.Fprintln(w, "  memfd_create: works")
	}
	name := fmt.Sprintf("@rsock-doctor-%d", os.Getpid())
	if ln, err := net.Listen("unixpacket", name); err != nil {
		fmt.Fprintf(w, "  abstract Unix sockets: fail: %v\n", err)
	} else {
		ln.Close()
		fmt.Fprintln(w, "  abstract Unix sockets: work")
	}
	if ns, err := os.Readlink("/proc/self/ns/net"); err != nil {
		fmt.Fprintf(w, "  network namespace: unknown: %v\n", err)
	} else {
		fmt.Fprintf(w, "  network namespace: %s (shm connects processes of the same namespace and boot)\n", ns)
	}
}

// memlock reports RLIMIT_MEMLOCK against what a verbs connection pins.
func memlock(w io.Writer) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		fmt.Fprintf(w, "  RLIMIT_MEMLOCK: %v\n", err)
		return
	}
	// The receive ring and the staging buffer: at the start size while
	// idle, at the full size once grown.
	idle, busy := uint64(2*rsock.DefaultRingStart), uint64(2*rsock.DefaultRingSize)
	if lim.Cur == unix.RLIM_INFINITY {
		fmt.Fprintf(w, "  RLIMIT_MEMLOCK: unlimited (a verbs connection pins about %d KiB idle, %d KiB once its rings grew)\n", idle>>10, busy>>10)
		return
	}
	fmt.Fprintf(w, "  RLIMIT_MEMLOCK: %d KiB: room for about %d idle verbs connections (%d KiB pinned each), %d busy ones (%d KiB)\n",
		lim.Cur>>10, lim.Cur/idle, idle>>10, lim.Cur/busy, busy>>10)
}

// iwarpAddrs reports the connection manager and returns the host's IPv4
// addresses it binds to one of the iWARP devices.
func iwarpAddrs(w io.Writer, iwarp []string) []netip.Addr {
	if err := ibverbs.LoadCM(); err != nil {
		fmt.Fprintf(w, "  librdmacm (for %s): not usable: %v\n", strings.Join(iwarp, ", "), err)
		return nil
	}
	fmt.Fprintln(w, "  librdmacm: loaded, rdma_cm event channel open")
	addrs, _ := net.InterfaceAddrs()
	var out []netip.Addr
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() || p.Addr().IsLoopback() {
			continue
		}
		dev, err := ibverbs.CMDevice(p.Addr())
		if err == nil && slices.Contains(iwarp, dev) {
			fmt.Fprintf(w, "  %v: %s (rdma_cm)\n", p.Addr(), dev)
			out = append(out, p.Addr())
		}
	}
	return out
}
