// Package rsock provides a net.Listener and net.Conn that carry a TCP
// connection's byte stream over an RDMA-style ring: verbs (InfiniBand,
// RoCE, iWARP, Soft-RoCE, soft-iWARP) between hosts, shm between processes
// of one host, and the TCP connection itself as the visible fallback.
//
// Listen and Dial have the shapes of net.Listen and net.Dial. A Listener
// serves rsock clients and plain TCP clients on one port; Dial talks to
// rsock servers and to plain ones. Every connection starts on its TCP
// connection and, by default, moves to its ring in the background after
// its first millisecond or 64 KiB (Config.UpgradeAfter, UpgradeBytes),
// without losing, repeating or reordering a byte; a ring whose transport
// fails moves the stream back to TCP the same way (failover).
//
// The Conn follows net.Conn's contract: Read and Write block (parking the
// goroutine, after an optional short busy-poll), deadlines fail calls with
// an error wrapping os.ErrDeadlineExceeded, Close unblocks every call, and
// errors are *net.OpError (a peer's abort or death matches
// syscall.ECONNRESET). Where a connection runs is never hidden: TransportOf,
// InfoOf and Settled (WaitSettled) report it, Connections and Totals report
// the process.
// The wire protocol is in the repository's docs/protocol.md.
//
// A grpc-go server serves a Listener as it is, and a client dials through
// a Dialer ("passthrough" hands the address to the dialer unresolved; the
// repository's examples/grpc does the same):
//
//	ln, err := rsock.Listen("tcp", ":50051")
//	srv := grpc.NewServer() // then register the services
//	go srv.Serve(ln)
//
//	d := &rsock.Dialer{}
//	cc, err := grpc.NewClient("passthrough:///"+addr,
//		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
//			return d.DialContext(ctx, "tcp", a)
//		}),
//		grpc.WithTransportCredentials(insecure.NewCredentials()))
package rsock
