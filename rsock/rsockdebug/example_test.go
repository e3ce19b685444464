package rsockdebug_test

import (
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"

	"github.com/rdmanet/rdmanet/rsock"
	"github.com/rdmanet/rdmanet/rsock/rsockdebug"
)

// The handler goes on the application's mux, wherever it likes. The page
// is HTML; with ?format=json it is the Report, which lists every open
// rsock connection of the process.
func ExampleHandler() {
	mux := http.NewServeMux()
	mux.Handle("/debug/rsock", rsockdebug.Handler())

	// A connection for the page to show.
	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	c, err := rsock.Dial("tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/rsock", nil))
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))

	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/rsock?format=json", nil))
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	var r rsockdebug.Report
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		log.Fatal(err)
	}
	listed := slices.ContainsFunc(r.Connections, func(s rsock.ConnState) bool {
		return s.LocalAddr == c.LocalAddr().String()
	})
	fmt.Println("the connection is listed:", listed)
	// Output:
	// 200 text/html; charset=utf-8
	// 200 application/json
	// the connection is listed: true
}
