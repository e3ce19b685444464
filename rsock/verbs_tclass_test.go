//go:build cgo && linux

package rsock

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Traffic classes of TestVerbsTwoHostsTrafficClass: the server's comes
// from its Config, the client's from its port's default_roce_tos.
const (
	serverTClass   = 72  // DSCP 18
	clientTClass   = 104 // DSCP 26
	clientCMTClass = 40  // DSCP 10
)

// TestVerbsTwoHostsTrafficClass: on RoCE, the packets of a verbs
// connection carry each side's traffic class in their IP header, as
// captured on the guest's netdev (UDP 4791): the server's from
// Config.TrafficClass, the client's, which sets none, from the port's
// rdma_cm default_roce_tos (configfs). Through rdma_cm (RSOCK_VERBS_CM=1)
// the client sets its Config.TrafficClass, which wins over the port's
// default, and the server's packets take the client's class, as rdma_cm's
// accepting side does. Each guest checks both directions.
func TestVerbsTwoHostsTrafficClass(t *testing.T) {
	role := os.Getenv("SOFTROCE_ROLE")
	if role != "server" && role != "client" {
		t.Skip("not in the Soft-RoCE two-host mode (SOFTROCE_ROLE is " + role + ")")
	}
	dev := os.Getenv("SOFTROCE_DEV")
	if !isRoCE(t, dev) {
		t.Skipf("%s is not RoCE: its packets are TCP, not RoCE v2", dev)
	}
	ip := verbsIP(t)
	const port = "7472"
	self, err := netip.ParseAddr(ip)
	require.NoError(t, err)
	peerIP, err := netip.ParseAddr(os.Getenv("SOFTROCE_PEER_IP"))
	require.NoError(t, err)
	viaCM, _ := strconv.ParseBool(os.Getenv("RSOCK_VERBS_CM"))
	server, client := uint8(serverTClass), uint8(clientTClass)
	if viaCM {
		server, client = clientCMTClass, clientCMTClass
	}
	want := map[netip.Addr]uint8{self: server, peerIP: client}
	if role == "client" {
		want = map[netip.Addr]uint8{self: client, peerIP: server}
		setDefaultROCETOS(t, dev, clientTClass)
	}
	capture := captureRoCE(t, os.Getenv("SOFTROCE_NETDEV"))

	if role == "server" {
		cfg := verbsCfg()
		cfg.TrafficClass = serverTClass
		ln, err := (&ListenConfig{Config: cfg}).Listen(context.Background(), "tcp", net.JoinHostPort(ip, port))
		require.NoError(t, err)
		defer ln.Close()
		c, err := ln.Accept()
		require.NoError(t, err)
		awaitSettledEnd(t, c.(*Conn))
		require.Equal(t, "verbs", TransportOf(c), c.(*Conn).Info().Reason)
		_, err = io.Copy(c, c)
		assert.NoError(t, err)
		c.Close()
	} else {
		peer := net.JoinHostPort(peerIP.String(), port)
		cfg := verbsCfg()
		if viaCM {
			cfg.TrafficClass = clientCMTClass
		}
		dial := func() (net.Conn, error) {
			return (&Dialer{Config: cfg, Timeout: 10 * time.Second}).Dial("tcp", peer)
		}
		c, err := dial() // the server guest may still be in the test before
		for end := time.Now().Add(90 * time.Second); err != nil && time.Now().Before(end); {
			time.Sleep(200 * time.Millisecond)
			c, err = dial()
		}
		require.NoError(t, err)
		require.Equal(t, "verbs", TransportOf(c), c.(*Conn).Info().Reason)
		echoCheck(t, c.(*Conn), 1<<20, 7)
		c.Close()
	}
	seen := capture.stop()
	for src, tos := range want {
		assert.NotZero(t, seen[src][tos], "no RoCE v2 packet from %v with traffic class %d (seen: %v)", src, tos, seen)
	}
	for src, byTOS := range seen {
		for tos, n := range byTOS {
			assert.Equal(t, want[src], tos, "%d RoCE v2 packets from %v with traffic class %d", n, src, tos)
		}
	}
}

// isRoCE reports whether dev's port 1 is RoCE: an Ethernet link layer on
// a device that is not an iWARP RNIC.
func isRoCE(t *testing.T, dev string) bool {
	base := filepath.Join("/sys/class/infiniband", dev)
	ll, err1 := os.ReadFile(filepath.Join(base, "ports/1/link_layer"))
	nt, err2 := os.ReadFile(filepath.Join(base, "node_type"))
	require.NoError(t, errors.Join(err1, err2), "device %q", dev)
	return strings.TrimSpace(string(ll)) == "Ethernet" && !strings.Contains(string(nt), "RNIC")
}

// setDefaultROCETOS sets dev port 1's default_roce_tos in rdma_cm's
// configfs tree for the test, and removes the device's directory after.
func setDefaultROCETOS(t *testing.T, dev string, tos int) {
	dir := filepath.Join("/sys/kernel/config/rdma_cm", dev)
	require.NoError(t, os.Mkdir(dir, 0o755), "rdma_cm's configfs (the guest mounts it and loads rdma_cm)")
	t.Cleanup(func() { assert.NoError(t, os.Remove(dir)) })
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ports/1/default_roce_tos"), []byte(strconv.Itoa(tos)), 0o644))
}

// roceCapture counts the RoCE v2 packets (IPv4, UDP port 4791) that a
// netdev sends and receives, by source address and traffic class.
type roceCapture struct {
	halt func() // stops the capture and waits for it
	mu   sync.Mutex
	seen map[netip.Addr]map[uint8]int
}

// stop ends the capture and returns what it counted.
func (c *roceCapture) stop() map[netip.Addr]map[uint8]int {
	c.halt()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// captureRoCE starts counting on netdev (AF_PACKET, both directions).
func captureRoCE(t *testing.T, netdev string) *roceCapture {
	ifi, err := net.InterfaceByName(netdev)
	require.NoError(t, err, "SOFTROCE_NETDEV")
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(htons(unix.ETH_P_ALL)))
	require.NoError(t, err, "a packet socket (root)")
	require.NoError(t, unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}))
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100_000}))
	c := &roceCapture{seen: map[netip.Addr]map[uint8]int{}}
	stop, done := make(chan struct{}), make(chan struct{})
	c.halt = sync.OnceFunc(func() { close(stop); <-done; unix.Close(fd) })
	t.Cleanup(c.halt)
	go func() {
		defer close(done)
		buf := make([]byte, 128) // headers only: the rest is truncated
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, unix.MSG_TRUNC)
			if err != nil {
				continue // the receive timeout: look at stop again
			}
			ll, ok := from.(*unix.SockaddrLinklayer)
			if !ok || ll.Protocol != htons(unix.ETH_P_IP) || n < 28 || buf[0]>>4 != 4 || buf[9] != unix.IPPROTO_UDP {
				continue
			}
			ihl := int(buf[0]&0xf) * 4
			if min(n, len(buf)) < ihl+4 || binary.BigEndian.Uint16(buf[ihl+2:]) != 4791 {
				continue
			}
			src := netip.AddrFrom4([4]byte(buf[12:16]))
			c.mu.Lock()
			if c.seen[src] == nil {
				c.seen[src] = map[uint8]int{}
			}
			c.seen[src][buf[1]]++
			c.mu.Unlock()
		}
	}()
	return c
}
