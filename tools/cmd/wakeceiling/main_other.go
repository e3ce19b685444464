//go:build !linux

// Command wakeceiling measures wake-up ceilings on Linux only.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "wakeceiling: Linux only (futex, eventfd)")
	os.Exit(2)
}
