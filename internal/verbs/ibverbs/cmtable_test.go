package ibverbs

import (
	"net/netip"
	"strings"
	"testing"
)

// TestCMTable: a connect request is accepted only with its ticket's
// number and secret, from the bootstrap peer's IP, on the QP's device,
// and only once. Every refusal is counted and leaves the ticket to its
// real peer.
func TestCMTable(t *testing.T) {
	var tb cmTable
	peer := netip.MustParseAddr("10.0.1.2")
	a := &cmTicket{dev: "siw0", peer: peer}
	b := &cmTicket{dev: "siw0"} // any peer
	for _, tk := range []*cmTicket{a, b} {
		if err := tb.add(tk); err != nil {
			t.Fatal(err)
		}
	}
	if a.num == b.num || a.num == 0 || a.secret == b.secret || a.secret == [cmSecretLen]byte{} {
		t.Fatalf("tickets not distinct: %d %x, %d %x", a.num, a.secret, b.num, b.secret)
	}
	wrong := a.pdata()
	wrong[len(wrong)-1] ^= 1
	other := b.pdata()
	copy(other, a.pdata()[:4]) // a's number with b's secret
	refusals := []struct {
		name  string
		pdata []byte
		peer  netip.Addr
		dev   string
		why   string
	}{
		{"no private data", nil, peer, "siw0", "too short"},
		{"short", a.pdata()[:cmPrivLen-1], peer, "siw0", "too short"},
		{"unknown number", (&cmTicket{num: 999}).pdata(), peer, "siw0", "no connection"},
		{"wrong secret", wrong, peer, "siw0", "wrong secret"},
		{"another ticket's secret", other, peer, "siw0", "wrong secret"},
		{"another address", a.pdata(), netip.MustParseAddr("10.0.1.3"), "siw0", "not from"},
		{"another device", a.pdata(), peer, "siw1", "another device"},
	}
	for i, r := range refusals {
		got, why := tb.claim(r.pdata, r.peer, r.dev)
		if got != nil || why == "" || !strings.Contains(why, r.why) {
			t.Errorf("%s: claimed %v (%q), want refused for %q", r.name, got, why, r.why)
		}
		if n := tb.rejected.Load(); n != uint64(i+1) {
			t.Errorf("%s: %d rejections counted, want %d", r.name, n, i+1)
		}
	}
	// The real peer still gets its ticket, an IPv4-mapped address too;
	// private data longer than the ticket (InfiniBand pads it) is fine.
	long := append(a.pdata(), make([]byte, 36)...)
	if got, why := tb.claim(long, netip.MustParseAddr("::ffff:10.0.1.2"), "siw0"); got != a {
		t.Fatalf("the real request: %v (%q), want ticket a", got, why)
	}
	if got, _ := tb.claim(a.pdata(), peer, "siw0"); got != nil {
		t.Fatal("a replayed request claimed the ticket again")
	}
	// A withdrawn ticket cannot be claimed.
	tb.remove(b)
	if got, _ := tb.claim(b.pdata(), peer, "siw0"); got != nil {
		t.Fatal("a withdrawn ticket was claimed")
	}
	if n := tb.rejected.Load(); n != uint64(len(refusals)+2) {
		t.Errorf("%d rejections counted, want %d", n, len(refusals)+2)
	}
}
