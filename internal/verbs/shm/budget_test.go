//go:build linux

package shm

import (
	"errors"
	"testing"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// TestMapBudget: a mapping past the budget fails with ErrMapBudget and
// maps nothing; unmapping makes room again; the count follows every
// mapping of a connected pair to zero.
func TestMapBudget(t *testing.T) {
	waitLinks(t) // an earlier test's lingering link would end, and unmap, meanwhile
	live0, _ := Mappings()
	a, b := pair(t, 16)
	live, _ := Mappings()
	if live <= live0 {
		t.Fatalf("a connected pair counts %d mappings, %d before", live, live0)
	}
	old := SetMapBudget(live + 1)
	defer SetMapBudget(old)
	mr := a.alloc(t, 4096, verbs.AccessRemoteWrite)
	if _, err := a.dev.AllocMR(4096, verbs.AccessRemoteWrite); !errors.Is(err, ErrMapBudget) || !verbs.LocalLimit(err) {
		t.Fatalf("AllocMR past the budget: %v, want ErrMapBudget, a local limit", err)
	}
	if n, _ := Mappings(); n != live+1 {
		t.Fatalf("%d mappings counted after a refused one, want %d", n, live+1)
	}
	if err := mr.Close(); err != nil {
		t.Fatal(err)
	}
	mr2, err := b.dev.AllocMR(4096, verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatalf("AllocMR after a region was freed: %v", err)
	}
	_ = mr2.Close()
}
