package rsock

import (
	"io"
	"testing"
	"time"
)

func TestTmpOneWay(t *testing.T) {
	cfg := &Config{Transports: []string{"shm"}}
	ln := listen(t, cfg)
	c, s := pipe(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	const n = 3000
	buf := make([]byte, 1<<20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rb := make([]byte, 1<<20)
		tot := 0
		for tot < n<<20 {
			k, err := s.Read(rb)
			if err != nil && err != io.EOF {
				t.Error(err)
				return
			}
			tot += k
		}
	}()
	start := time.Now()
	for range n {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	<-done
	el := time.Since(start)
	t.Logf("%.1f GB/s", float64(n<<20)/el.Seconds()/1e9)
	t.Logf("writer %+v", c.Info())
	t.Logf("reader %+v", s.Info())
}
