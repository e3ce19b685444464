package ibverbs

import (
	"net/netip"
	"testing"
)

// TestInventory reads a fake sysfs: devices, ports, their state and link
// layer, and the GIDs with the IPv4 address of a mapped one; an iWARP
// device is marked; a tree without the infiniband class is an error.
func TestInventory(t *testing.T) {
	files := map[string]string{}
	roceDev(files, "rxe0", "1", map[string][2]string{
		"0": {"fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"},
		"1": {"0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2"},
	})
	files["class/infiniband/rxe0/ports/1/state"] = "4: ACTIVE"
	files["class/net/veth0/mtu"] = "1500"
	files["class/infiniband/siw0/node_type"] = "4: RNIC"
	files["class/infiniband/siw0/ports/1/link_layer"] = "Ethernet"
	files["class/infiniband/siw0/ports/1/state"] = "1: DOWN"
	devs, err := fakeSysfs(t, files).inventory()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].Name != "rxe0" || devs[1].Name != "siw0" {
		t.Fatalf("devices %+v", devs)
	}
	rxe := devs[0]
	if rxe.IWARP || len(rxe.Ports) != 1 || rxe.Ports[0].State != "ACTIVE" || rxe.Ports[0].LinkLayer != "Ethernet" || rxe.Ports[0].Netdev != "veth0" || rxe.Ports[0].NetdevMTU != 1500 {
		t.Fatalf("rxe0: %+v", rxe)
	}
	g := rxe.Ports[0].GIDs
	if len(g) != 2 || g[1].Index != 1 || g[1].Type != "RoCE v2" || g[1].IPv4 != netip.MustParseAddr("10.0.0.1") || g[0].IPv4.IsValid() || g[1].Netdev != "veth0" {
		t.Fatalf("rxe0 GIDs: %+v", g)
	}
	if !devs[1].IWARP || devs[1].Ports[0].State != "DOWN" {
		t.Fatalf("siw0: %+v", devs[1])
	}
	if _, err := fakeSysfs(t, map[string]string{"class/net/lo/mtu": "65536"}).inventory(); err == nil {
		t.Fatal("no infiniband class: no error")
	}
}
