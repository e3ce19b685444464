package perf

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The benchmark protocol. Each connection to the server's perf listener
// starts with a 16-byte header naming what the connection is for; what
// follows depends on the op:
//
//	echo    every byte read is written back (ping-pong, setup rate)
//	sink    bytes are read and dropped until EOF; the server then writes
//	        the count as 8 bytes, big endian
//	bidir   as sink, while the server writes Param-byte chunks until its
//	        reading side has seen EOF; then it closes its writing side
//	idle    nothing: the server waits for EOF
//	control 1-byte requests ('s' stats, 'g' garbage-collect then stats),
//	        each answered with a 4-byte length and a JSON ProcStats
//	info    the server writes a 4-byte length and a JSON ServerInfo
const (
	opEcho    byte = 'E'
	opSink    byte = 'S'
	opBidir   byte = 'B'
	opIdle    byte = 'I'
	opControl byte = 'C'
	opInfo    byte = 'N'
)

var magic = [4]byte{'R', 'S', 'P', 'F'}

const headerLen = 16

// header is a connection's first message.
type header struct {
	Op    byte
	Param uint64
}

func (h header) marshal() []byte {
	b := make([]byte, headerLen)
	copy(b, magic[:])
	b[4] = h.Op
	binary.BigEndian.PutUint64(b[8:], h.Param)
	return b
}

func readHeader(r io.Reader) (header, error) {
	var b [headerLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return header{}, err
	}
	if [4]byte(b[:4]) != magic {
		return header{}, errors.New("not an rsockperf connection")
	}
	return header{Op: b[4], Param: binary.BigEndian.Uint64(b[8:])}, nil
}

// maxFrame bounds a JSON frame.
const maxFrame = 1 << 20

func writeFrame(w io.Writer, v any) error {
	js, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b := make([]byte, 4+len(js))
	binary.BigEndian.PutUint32(b, uint32(len(js)))
	copy(b[4:], js)
	_, err = w.Write(b)
	return err
}

func readFrame(r io.Reader, v any) error {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return err
	}
	l := binary.BigEndian.Uint32(n[:])
	if l > maxFrame {
		return fmt.Errorf("frame of %d bytes", l)
	}
	b := make([]byte, l)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// ServerInfo is what a server says about itself.
type ServerInfo struct {
	Mode      string `json:"mode"`
	Transport string `json:"transport"` // "" for plain TCP
	PerfAddr  string `json:"perf_addr"`
	HTTPAddr  string `json:"http_addr"`
	GRPCAddr  string `json:"grpc_addr"`
	PID       int    `json:"pid"`
}
