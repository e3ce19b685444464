package rsock

// note is a wake-up remembered until taken: a channel of capacity 1
// (newNote), which a waiter receives from.
type note chan struct{}

func newNote() note { return make(note, 1) }

// wake signals n without blocking: the waiter wakes, or the next one
// returns at once.
func (n note) wake() {
	select {
	case n <- struct{}{}:
	default:
	}
}
