package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"sync"
)

// data returns an endless deterministic stream of pseudo-random bytes for
// seed, so both ends can produce or check the same bytes.
func data(seed uint64) io.Reader {
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	return rand.NewChaCha8(key)
}

var sums sync.Map // [2]uint64{seed, n} -> string

// dataSum is the hex SHA-256 of the first n bytes of data(seed).
func dataSum(seed uint64, n int64) string {
	k := [2]uint64{seed, uint64(n)}
	if s, ok := sums.Load(k); ok {
		return s.(string)
	}
	h := sha256.New()
	if _, err := io.CopyN(h, data(seed), n); err != nil {
		panic(err)
	}
	s := hex.EncodeToString(h.Sum(nil))
	sums.Store(k, s)
	return s
}

// hashReader returns the byte count and hex SHA-256 of what r yields.
func hashReader(r io.Reader) (int64, string, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return n, hex.EncodeToString(h.Sum(nil)), err
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
