package main

import (
	"context"
	"net"
)

type contextT = context.Context

func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}
