package rsock

import (
	"bytes"
	"fmt"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

// rescueLateHello runs on the first Read of a connection the listener
// handed to Accept as plain TCP after its sniff timed out: a late hello is
// consumed and declined (docs/protocol.md §2.5), anything else becomes the
// replayed prefix, as for any plain client.
func (c *Conn) rescueLateHello() error {
	c.prefixMu.Lock()
	defer c.prefixMu.Unlock()
	if !c.late.Load() {
		return nil
	}
	defer c.late.Store(false)
	var buf [len(handshake.Magic)]byte
	n, err := sniffMagic(c.tcp, buf[:], copy(buf[:], c.prefix))
	if err != nil || !handshake.MatchesMagicPrefix(buf[:n]) {
		c.setPrefixLocked(bytes.Clone(buf[:n]))
		if n > 0 {
			return nil // the bytes first; an error comes again on the next Read
		}
		return err
	}
	c.setPrefixLocked(nil) // buf is the magic: none of it is the application's
	msg, err := handshake.ReadAfterMagic(c.tcp)
	if err != nil {
		return fmt.Errorf("rsock: a late rsock hello did not parse: %w", err)
	}
	hello, ok := msg.(*handshake.Hello)
	if !ok {
		return fmt.Errorf("rsock: a late rsock client opened with %v", msg.Type())
	}
	const why = "the hello arrived after the listener's sniff timeout"
	if err := handshake.Write(c.tcp, &handshake.Decline{Code: handshake.DeclinePolicy, Reason: why}); err != nil {
		return err
	}
	if hello.Flags&handshake.FlagEarly != 0 {
		// Its frames follow the hello and are not plain TCP: the client
		// fails with ErrEarlyRefused, and so does this connection.
		c.tcp.Close()
		return fmt.Errorf("rsock: a late early hello (%s): the frames after it are not plain TCP", why)
	}
	c.relabel(&label{transport: "tcp", code: CodeDeclined, fallback: true, reason: "declined: " + why})
	return nil
}

func (c *Conn) setPrefixLocked(b []byte) {
	c.prefix = b
	c.hasPrefix.Store(len(b) > 0)
}
