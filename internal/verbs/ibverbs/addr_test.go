package ibverbs

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeSysfs builds a sysfs tree: files maps paths under root to contents.
func fakeSysfs(t *testing.T, files map[string]string) sysfs {
	t.Helper()
	root := t.TempDir()
	for p, v := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return sysfs{root: root}
}

// roceDev adds a RoCE device with the given GID table (index -> gid, type).
func roceDev(files map[string]string, dev string, port string, gids map[string][2]string) {
	base := "class/infiniband/" + dev
	files[base+"/node_type"] = "1: CA"
	files[base+"/ports/"+port+"/link_layer"] = "Ethernet"
	for idx, g := range gids {
		files[base+"/ports/"+port+"/gids/"+idx] = g[0]
		files[base+"/ports/"+port+"/gid_attrs/types/"+idx] = g[1]
		files[base+"/ports/"+port+"/gid_attrs/ndevs/"+idx] = "veth0"
	}
}

func tcp(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 1} }

func TestSelectTargetRoCE(t *testing.T) {
	files := map[string]string{}
	roceDev(files, "rxe0", "1", map[string][2]string{
		"0": {"fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"},
		"1": {"0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2"},
		"2": {"0000:0000:0000:0000:0000:ffff:0a00:0001", "IB/RoCE v1"},
		"3": {"0000:0000:0000:0000:0000:0000:0000:0000", ""}, // empty entry
	})
	roceDev(files, "rxe1", "1", map[string][2]string{
		"0": {"fe80:0000:0000:0000:0000:00ff:fe00:0002", "IB/RoCE v1"},
		"1": {"0000:0000:0000:0000:0000:ffff:0a00:0002", "IB/RoCE v1"},
	})
	s := fakeSysfs(t, files)

	for _, tc := range []struct {
		ip, dev string
		gid     int
	}{
		{"10.0.0.1", "rxe0", 1}, // RoCE v2 preferred over v1 for the same IP
		{"10.0.0.2", "rxe1", 1}, // v1 when that is all there is
		{"::ffff:10.0.0.1", "rxe0", 1},
	} {
		got, err := s.selectTarget(tcp(tc.ip), "", 0, -1)
		if err != nil {
			t.Fatalf("%s: %v", tc.ip, err)
		}
		if got.dev != tc.dev || got.port != 1 || got.gidIndex != tc.gid || !got.roce {
			t.Errorf("%s: got %+v, want %s port 1 GID %d RoCE", tc.ip, got, tc.dev, tc.gid)
		}
	}

	// Overrides: a device restricts the search; a GID index needs no match.
	if _, err := s.selectTarget(tcp("10.0.0.1"), "rxe1", 0, -1); !errors.Is(err, errNoDevice) {
		t.Errorf("10.0.0.1 restricted to rxe1: %v, want errNoDevice", err)
	}
	got, err := s.selectTarget(nil, "rxe1", 1, 0)
	if err != nil || got.dev != "rxe1" || got.port != 1 || got.gidIndex != 0 {
		t.Errorf("explicit rxe1/1/0: %+v, %v", got, err)
	}
	if _, err := s.selectTarget(tcp("10.0.0.1"), "mlx5_9", 0, -1); err == nil || !strings.Contains(err.Error(), "rxe0, rxe1") {
		t.Errorf("unknown device: %v, want the list of devices", err)
	}

	// Addresses no port holds.
	for _, ip := range []string{"127.0.0.1", "10.9.9.9", "::1"} {
		_, err := s.selectTarget(tcp(ip), "", 0, -1)
		if !errors.Is(err, errNoDevice) {
			t.Errorf("%s: %v, want errNoDevice", ip, err)
		}
		if ip == "127.0.0.1" && !strings.Contains(err.Error(), "loopback") {
			t.Errorf("127.0.0.1: %v, want the loopback explained", err)
		}
	}
	if _, err := s.selectTarget(&net.UnixAddr{Name: "x"}, "", 0, -1); !errors.Is(err, errNoDevice) {
		t.Errorf("a non-TCP address: %v, want errNoDevice", err)
	}
}

func TestSelectTargetNoDevices(t *testing.T) {
	s := sysfs{root: t.TempDir()}
	_, err := s.selectTarget(tcp("10.0.0.1"), "", 0, -1)
	if !errors.Is(err, errNoDevice) || !strings.Contains(err.Error(), "no RDMA devices") {
		t.Fatalf("got %v, want 'no RDMA devices'", err)
	}
}

// TestSelectTargetIWARP: an iWARP device has no GID per address; the
// connection manager names the device that serves the IP. Without one
// (librdmacm missing, or nil), the device is declined with the reason.
func TestSelectTargetIWARP(t *testing.T) {
	files := map[string]string{}
	roceDev(files, "rxe0", "1", map[string][2]string{"1": {"0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2"}})
	files["class/infiniband/siw0/node_type"] = "4: RNIC"
	files["class/infiniband/siw0/ports/1/link_layer"] = "Ethernet"
	files["class/infiniband/siw0/ports/1/gids/0"] = "5254:00ff:fe12:3456:0000:0000:0000:0000"
	s := fakeSysfs(t, files)
	asked := ""
	s.cm = func(ip netip.Addr) (string, error) {
		asked = ip.String()
		if ip == netip.MustParseAddr("10.0.1.1") {
			return "siw0", nil
		}
		return "", errors.New("rdma_cm finds no device")
	}

	// RoCE keeps its path: the GID match, without asking rdma_cm.
	got, err := s.selectTarget(tcp("10.0.0.1"), "", 0, -1)
	if err != nil || got.dev != "rxe0" || got.iwarp || asked != "" {
		t.Fatalf("10.0.0.1: %+v, %v (rdma_cm asked for %q), want rxe0 by GID", got, err, asked)
	}
	got, err = s.selectTarget(tcp("10.0.1.1"), "", 0, -1)
	if err != nil || got != (target{dev: "siw0", port: 1, iwarp: true}) {
		t.Fatalf("10.0.1.1: %+v, %v, want siw0 port 1 through rdma_cm", got, err)
	}
	if _, err = s.selectTarget(tcp("10.0.2.1"), "", 0, -1); !errors.Is(err, errNoDevice) || !strings.Contains(err.Error(), "rdma_cm finds no device") {
		t.Fatalf("10.0.2.1: %v, want no device with rdma_cm's reason", err)
	}
	// An explicit device and GID index (the test harness's override).
	got, err = s.selectTarget(nil, "siw0", 0, 0)
	if err != nil || !got.iwarp || got.roce || got.dev != "siw0" {
		t.Fatalf("override siw0: %+v, %v, want iWARP", got, err)
	}
	// rdma_cm binds the IP to a RoCE device: not an iWARP target.
	s.cm = func(netip.Addr) (string, error) { return "rxe0", nil }
	if _, err = s.selectTarget(tcp("10.0.1.1"), "", 0, -1); !errors.Is(err, errNoDevice) || !strings.Contains(err.Error(), "not to an iWARP device") {
		t.Fatalf("rdma_cm on rxe0: %v", err)
	}
	s.cm = nil
	if _, err = s.selectTarget(tcp("10.0.1.1"), "", 0, -1); !errors.Is(err, errNoDevice) || !strings.Contains(err.Error(), "siw0 is iWARP") {
		t.Fatalf("no connection manager: %v, want siw0 declined", err)
	}
}

// TestCachedTarget: a selected target serves later connections from the
// same IP unchecked for targetTTL; past it, a RoCE v2 target is checked by
// its own GID entry, and selected anew once that entry no longer holds
// the IP.
func TestCachedTarget(t *testing.T) {
	files := map[string]string{}
	roceDev(files, "rxe0", "1", map[string][2]string{
		"1": {"0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2"},
		"2": {"0000:0000:0000:0000:0000:ffff:0a00:0001", "IB/RoCE v1"},
	})
	s := fakeSysfs(t, files)
	defer func(ttl time.Duration) { targetTTL = ttl }(targetTTL)
	targetTTL = time.Hour
	got, err := s.cachedTarget(tcp("10.0.0.1"), "", 0, -1)
	if err != nil || got.gidIndex != 1 {
		t.Fatalf("first selection: %+v, %v; want GID 1", got, err)
	}
	// The v2 entry moves to another address.
	gid1 := filepath.Join(s.root, "class/infiniband/rxe0/ports/1/gids/1")
	if err := os.WriteFile(gid1, []byte("0000:0000:0000:0000:0000:ffff:0a00:0009\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.cachedTarget(tcp("10.0.0.1"), "", 0, -1); got.gidIndex != 1 {
		t.Errorf("within the TTL: %+v, want the cached GID 1", got)
	}
	targetTTL = 0
	forgetGIDTables() // the GID table's own cache would hide the changes
	if got, err := s.cachedTarget(tcp("10.0.0.1"), "", 0, -1); err != nil || got.gidIndex != 2 {
		t.Errorf("past the TTL, the entry changed: %+v, %v; want GID 2 (v1)", got, err)
	}
	// A v1 target is selected anew each time past the TTL: GID 1 holds
	// the IP as v2 again, and wins.
	if err := os.WriteFile(gid1, []byte("0000:0000:0000:0000:0000:ffff:0a00:0001\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	forgetGIDTables()
	if got, err := s.cachedTarget(tcp("10.0.0.1"), "", 0, -1); err != nil || got.gidIndex != 1 {
		t.Errorf("v1 reselected: %+v, %v; want GID 1 (v2)", got, err)
	}
	// The address leaves the port: an error, not the cached target.
	for _, i := range []string{"1", "2"} {
		if err := os.WriteFile(filepath.Join(s.root, "class/infiniband/rxe0/ports/1/gids", i), []byte("0000:0000:0000:0000:0000:0000:0000:0000\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	forgetGIDTables()
	if _, err := s.cachedTarget(tcp("10.0.0.1"), "", 0, -1); !errors.Is(err, errNoDevice) {
		t.Errorf("address gone: %v, want errNoDevice", err)
	}
}

// forgetGIDTables empties the GID table cache.
func forgetGIDTables() {
	gidTables.mu.Lock()
	gidTables.m = nil
	gidTables.mu.Unlock()
}

// defaultTOS reads the administrator's default_roce_tos from rdma_cm's
// configfs tree, per device and port; without it (or with nonsense) the
// class is 0.
func TestDefaultTOS(t *testing.T) {
	s := fakeSysfs(t, map[string]string{
		"kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos": "106",
		"kernel/config/rdma_cm/mlx5_0/ports/2/default_roce_tos": "300",
		"kernel/config/rdma_cm/mlx5_1/ports/1/default_roce_tos": "",
	})
	for _, tc := range []struct {
		dev  string
		port int
		want uint8
	}{
		{"mlx5_0", 1, 106},
		{"mlx5_0", 2, 0},
		{"mlx5_1", 1, 0},
		{"rxe0", 1, 0},
	} {
		if got := s.defaultTOS(tc.dev, tc.port); got != tc.want {
			t.Errorf("%s port %d: default TOS %d, want %d", tc.dev, tc.port, got, tc.want)
		}
	}
}

// A RoCE port counts as down once its GID's netdev loses its carrier or
// stops running (the kernel then refuses to read carrier); a netdev that
// is not there to read (another network namespace's) does not count.
func TestGIDNetdevCarrier(t *testing.T) {
	files := map[string]string{
		"class/net/veth0/carrier": "1",
		"class/net/veth1/carrier": "0",
	}
	roceDev(files, "rxe0", "1", map[string][2]string{
		"1": {"0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2"},
	})
	files["class/infiniband/rxe0/ports/1/gids/2"] = "0000:0000:0000:0000:0000:ffff:0a00:0002"
	files["class/infiniband/rxe0/ports/1/gid_attrs/ndevs/2"] = "veth1"
	s := fakeSysfs(t, files)
	for _, tc := range []struct {
		gid  int
		ndev string
		up   bool
	}{
		{1, "veth0", true},
		{2, "veth1", false}, // no carrier
		{3, "", false},      // no such GID
	} {
		ndev := s.gidNetdev("rxe0", 1, tc.gid)
		if ndev != tc.ndev {
			t.Errorf("GID %d: netdev %q, want %q", tc.gid, ndev, tc.ndev)
		}
		if ndev != "" && s.carrierUp(ndev) != tc.up {
			t.Errorf("GID %d (%s): carrier up %v, want %v", tc.gid, ndev, !tc.up, tc.up)
		}
	}
	// A closed netdev's carrier cannot be read (EINVAL; here EISDIR).
	if err := os.MkdirAll(filepath.Join(s.root, "class/net/veth2/carrier"), 0o755); err != nil {
		t.Fatal(err)
	}
	if s.carrierUp("veth2") {
		t.Error("a netdev whose carrier cannot be read counts as up")
	}
	if !s.carrierUp("veth9") {
		t.Error("a netdev this process cannot see counts as down")
	}
}
