// Command setupceiling measures the best connection setup rate that a
// client which waits for the server's answer before its first byte can
// reach, with no rsock code: the ceiling that BENCHMARKS.md quotes for
// rsock's setup rate with the early dial off.
//
// Each cycle dials, makes one 1-byte round trip and closes, as rsockperf's
// setup workload does, against a server in another process that accepts on
// one goroutine and serves each connection on one of its own.
//
//	plain   the cycle alone (rsockperf's plain TCP)
//	rtt     one more 1-byte round trip after the first (rsockperf's
//	        one_more_rtt_x): a round trip to a connection being served
//	answer  before its first byte the client writes a hello and waits for
//	        the answer (rsock's sizes, 94 and 29 bytes); the server reads
//	        the hello as the connection's first bytes: a round trip that
//	        waits for the server's accept
//
// Each round runs the three modes for -duration each, in a rotating order,
// and prints the rates of rtt and answer as ratios to plain's in that round.
//
//	go run ./cmd/setupceiling [-rounds 5] [-duration 150ms]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"time"
)

const helloLen, answerLen = 94, 29

func main() {
	if len(os.Args) == 2 && os.Args[1] == "-child" {
		serve()
		return
	}
	rounds := flag.Int("rounds", 5, "rounds")
	dur := flag.Duration("duration", 150*time.Millisecond, "time per mode per round")
	flag.Parse()
	cmd := exec.Command(os.Args[0], "-child")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	check(err)
	check(cmd.Start())
	defer cmd.Process.Kill()
	addr, err := bufio.NewReader(out).ReadString('\n')
	check(err)
	addr = addr[:len(addr)-1]
	modes := []string{"plain", "rtt", "answer"}
	ratio := map[string][]float64{}
	for r := range *rounds {
		rate := map[string]float64{}
		for i := range modes {
			m := modes[(r+i)%len(modes)]
			rate[m] = run(addr, m, *dur)
		}
		fmt.Printf("round %d: plain %.0f/s, rtt %.3fx, answer %.3fx\n", r+1, rate["plain"], rate["rtt"]/rate["plain"], rate["answer"]/rate["plain"])
		for _, m := range modes[1:] {
			ratio[m] = append(ratio[m], rate[m]/rate["plain"])
		}
	}
	for _, m := range modes[1:] {
		s := ratio[m]
		slices.Sort(s)
		fmt.Printf("%s: median %.3fx (%.3f-%.3f)\n", m, s[len(s)/2], s[0], s[len(s)-1])
	}
}

// run makes cycles of mode for d and returns their rate.
func run(addr, mode string, d time.Duration) float64 {
	hello, answer := make([]byte, helloLen), make([]byte, answerLen)
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		c, err := net.Dial("tcp", addr)
		check(err)
		first := byte('p')
		switch mode {
		case "rtt":
			first = 'r'
		case "answer":
			hello[0] = 'a'
			_, err = c.Write(hello)
			check(err)
			_, err = io.ReadFull(c, answer)
			check(err)
		}
		trips := 1
		if mode == "rtt" {
			trips = 2
		}
		b := []byte{first}
		for range trips {
			_, err = c.Write(b)
			check(err)
			_, err = io.ReadFull(c, b)
			check(err)
		}
		c.Close()
		n++
	}
	return float64(n) / time.Since(start).Seconds()
}

// serve is the server: it prints its address, then echoes every
// connection's bytes, answering a hello first where one comes.
func serve() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	fmt.Println(ln.Addr())
	for {
		c, err := ln.Accept()
		check(err)
		go func() {
			defer c.Close()
			b := make([]byte, helloLen)
			if _, err := io.ReadFull(c, b[:1]); err != nil {
				return
			}
			if b[0] == 'a' {
				if _, err := io.ReadFull(c, b[1:]); err != nil {
					return
				}
				if _, err := c.Write(b[:answerLen]); err != nil {
					return
				}
			} else if _, err := c.Write(b[:1]); err != nil {
				return
			}
			_, _ = io.Copy(c, c)
		}()
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "setupceiling:", err)
		os.Exit(1)
	}
}
